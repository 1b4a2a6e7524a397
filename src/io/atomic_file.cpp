#include "io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "moe/error.h"

namespace moe {
namespace {

[[noreturn]] void fail_errno(const char* action, const std::string& path, int err) {
  fail("cannot ", action, " '", path, "': ", std::strerror(err));
}

// "<path>.tmp.<pid>.<n>": unique across threads and concurrent processes.
std::string temp_name(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
}

// Flushes, syncs and closes f (always closed on return or throw: f is reset).
void flush_and_close(std::FILE*& f, const std::string& path) {
  int err = 0;
  if (std::ferror(f)) err = errno ? errno : EIO;
  if (!err && std::fflush(f) != 0) err = errno;
  if (!err && ::fsync(::fileno(f)) != 0) err = errno;
  if (std::fclose(f) != 0 && !err) err = errno;
  f = nullptr;
  if (err) fail_errno("write", path, err);
}

// Makes a completed rename durable. Filesystems that cannot sync a directory
// (EINVAL) are accepted: there is nothing more we can do there.
void sync_parent_dir(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail_errno("open the directory of", path, errno);
  int err = ::fsync(fd) != 0 ? errno : 0;
  ::close(fd);
  if (err && err != EINVAL) fail_errno("sync the directory of", path, err);
}

std::FILE* create_exclusive(const std::string& tmp, const std::string& path) {
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) fail_errno("create a temporary file for", path, errno);
  std::FILE* f = ::fdopen(fd, "wb");
  if (!f) {
    int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    fail_errno("open a stream for", path, err);
  }
  return f;
}

}  // namespace

void write_file_atomic(const std::string& path, const std::function<void(std::FILE*)>& writer) {
  const std::string tmp = temp_name(path);
  std::FILE* f = create_exclusive(tmp, path);
  try {
    errno = 0;
    writer(f);
    flush_and_close(f, path);
    if (std::rename(tmp.c_str(), path.c_str()) != 0) fail_errno("rename a temporary file onto", path, errno);
  } catch (...) {
    if (f) std::fclose(f);
    ::unlink(tmp.c_str());
    throw;
  }
  sync_parent_dir(path);
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  write_file_atomic(path, [&](std::FILE* f) { std::fwrite(bytes.data(), 1, bytes.size(), f); });
}

void ensure_directory(const std::string& dir, const std::string& what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(dir, ec)) return;
  if (fs::exists(fs::symlink_status(dir, ec))) fail(what, ": '", dir, "' exists and is not a directory");
  for (fs::path p = fs::path(dir).parent_path(); !p.empty() && p != p.root_path(); p = p.parent_path())
    if (fs::exists(p, ec) && !fs::is_directory(p, ec))
      fail(what, ": cannot create directory '", dir, "': '", p.string(), "' is not a directory");
  fs::create_directories(dir, ec);
  if (ec) fail(what, ": cannot create directory '", dir, "': ", ec.message());
}

}  // namespace moe
