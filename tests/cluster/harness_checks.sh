# shellcheck shell=bash
# Sourced by cluster_test.sh (mode harness): scripts/cluster.sh itself.
expect_fail() {  # expect_fail PATTERN CMD...: CMD fails (status 1) with PATTERN in its message
  local pat=$1 out rc
  shift
  out=$("$@" 2>&1)
  rc=$?
  [ $rc -eq 1 ] && echo "$out" | grep -q -- "$pat" || die "'$*': expected status 1 and '$pat', got $rc: $out"
  echo "error as expected: $(echo "$out" | grep -- "$pat" | head -1)"
}
expect_fail "expected the number of hosts" "$CLUSTER" up x --name ctbad-$$
expect_fail "--link rate 'fast'" "$CLUSTER" up 2 --name ctbad-$$ --link fast
expect_fail "--name 'Bad_Name'" "$CLUSTER" up 2 --name Bad_Name
expect_fail "is not up" "$CLUSTER" mpirun --name ctnone-$$ -np 1 true

# Not root: skipped with the reason (status 77), nothing made.
if [ "$(id -u)" -eq 0 ] && command -v setpriv > /dev/null; then
  # A copy nobody can read: the checkout may sit in a directory only root enters (mktemp -d).
  pub=$(mktemp -d) && chmod 755 "$pub" && cp "$(dirname "$CLUSTER")"/cluster*.sh "$pub/" && chmod 755 "$pub"/cluster*.sh
  out=$(cd / && setpriv --reuid 65534 --regid 65534 --clear-groups "$pub/cluster.sh" up 1 --name ctuser-$$ 2>&1)
  rc=$?
  rm -rf "$pub"
  [ $rc -eq 77 ] && echo "$out" | grep -q "not root" || die "up as nobody: expected status 77 and 'not root', got $rc: $out"
  echo "not root: $out"
fi

up h 3 2 --link 100mbit,2ms
name=${C##*/}
echo "$UP_OUT" | grep -q "link: rate 100mbit each way" || die "up did not report the rate"
echo "$UP_OUT" | grep -Eq "link: delay 2ms (on every host's sending side|NOT applied: this kernel has no sch_netem)" ||
  die "up did not report whether the delay is applied"
[ "$(wc -l < "$C/hostfile")" = 3 ] && grep -q "^$name-h2 slots=2$" "$C/hostfile" || die "hostfile: $(cat "$C/hostfile")"
for i in 0 1 2; do
  hn=$("$CLUSTER" exec --name "$name" h$i hostname) || die "exec on h$i failed"
  [ "$hn" = "$name-h$i" ] || die "host h$i has hostname '$hn'"
  addr=$("$CLUSTER" exec --name "$name" h$i ip -4 -o addr show dev eth0 | awk '{print $4}')
  [ "$addr" = "10.77.0.$((i + 1))/24" ] || die "host h$i has address '$addr'"
  q=$(ip netns exec "moe-$name-h$i" tc qdisc show dev eth0)
  echo "$q" | grep -q "tbf .*rate 100Mbit" || die "host h$i: no tbf at 100mbit: $q"
  # A small bucket, so a message of a step (tens to hundreds of kB) is shaped too, not only streams.
  b=$(echo "$q" | sed -nE 's/.* burst ([0-9]+)([KM]?)b .*/\1 \2/p')
  read -r bn bu <<<"$b"
  case ${bu:-} in K) bn=$((bn * 1024)) ;; M) bn=$((bn * 1048576)) ;; esac
  [ -n "${bn:-}" ] && ((bn <= 32768)) || die "host h$i: tbf bucket '$b', expected at most 32 KiB: $q"
  if ip netns exec "moe-$name-h$i" tc qdisc show dev eth0 | grep -q netem; then
    echo "$q" | grep -q "delay 2ms" || die "host h$i: netem without the delay: $q"
  fi
done
echo "3 hosts: hostnames, addresses and tbf qdiscs as expected"
# A host reaches another over the bridge: a listener on h2, a client on h0 that retries while the
# listener starts (python's start-up takes seconds on a loaded machine).
"$CLUSTER" exec --name "$name" h2 timeout 30 python3 -c "
import socket; s = socket.socket(); s.bind(('10.77.0.3', 7777)); s.listen(); c, a = s.accept(); c.send(a[0].encode())" &
peer=$("$CLUSTER" exec --name "$name" h0 timeout 30 python3 -c "
import socket, time
for i in range(100):
    try: s = socket.create_connection(('10.77.0.3', 7777), timeout=5); break
    except ConnectionRefusedError: time.sleep(0.2)
print(s.recv(64).decode())") || die "h0 could not connect to h2"
wait
[ "$peer" = 10.77.0.1 ] || die "h2 saw the connection from '$peer', expected 10.77.0.1"
echo "h0 -> h2 over TCP: h2 sees 10.77.0.1"
"$CLUSTER" status --name "$name" || die "status failed"
# placement: one line per rank, on its host, on its host's cpus (3 hosts on 2 cores share them all).
pl=$("$CLUSTER" placement --name "$name" 6) || die "placement failed: $pl"
echo "$pl"
[ "$(grep -c "^rank [0-5]: host $name-h[0-2], cpus " <<<"$pl")" = 6 ] || die "placement: expected 6 ranks: $pl"
grep -q "^rank 5: host $name-h2," <<<"$pl" || die "placement: rank 5 not on h2: $pl"
expect_fail "expected the number of ranks" "$CLUSTER" placement --name "$name" x
expect_fail "exists" "$CLUSTER" up 1 --name "$name"

# A crash: a process left running in a host; down ends it and removes everything, twice.
"$CLUSTER" exec --name "$name" h1 sleep 300 &
left=$!
sleep 1
"$CLUSTER" down --name "$name" || die "down failed"
"$CLUSTER" down --name "$name" > /dev/null || die "second down failed"
wait $left 2> /dev/null
kill -0 $left 2> /dev/null && die "the process left in h1 still runs after down"
ip netns list | grep -q "^moe-$name-" && die "namespaces left after down: $(ip netns list | grep "^moe-$name-")"
[ -e "/run/moe-cluster/$name" ] && die "state left after down: /run/moe-cluster/$name"
grep -q "/run/moe-cluster/$name/" /proc/mounts && die "mounts left after down"
echo "down: the process left in a host ended; no namespace, mount or state left; down twice is fine"
