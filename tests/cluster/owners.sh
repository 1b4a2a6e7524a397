# Sourced by the cluster tests (cluster_test.sh, fail_test.sh). Every cluster a test makes holds the
# test's process id in its state's test_owner, so a later run can tell a cluster whose test is gone
# (killed by CTest's timeout) from one another run still uses.
#   reap_orphan_clusters CLUSTER_SH: takes down every cluster whose owner is gone.
#   own_cluster NAME: marks cluster NAME as this test's.
reap_orphan_clusters() {
  local f
  for f in /run/moe-cluster/*/test_owner; do
    [ -f "$f" ] || continue
    kill -0 "$(cat "$f")" 2> /dev/null || "$1" down --name "$(basename "$(dirname "$f")")" > /dev/null 2>&1
  done
}
own_cluster() { echo $$ > "/run/moe-cluster/$1/test_owner"; }
