#include "io/atomic_file.h"

#include <gtest/gtest.h>

#include <stdexcept>

#include "moe/error.h"
#include "testing/temp_dir.h"

namespace moe {
namespace {

using moe::testing::read_bytes;
using moe::testing::TempDir;
using moe::testing::write_bytes;

// The message of the moe::Error that f throws ("" and a test failure if none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a moe::Error";
  return "";
}

TEST(AtomicFile, WritesAndReplacesLeavingNoTempFiles) {
  TempDir dir;
  const std::string path = dir.file("out.bin");
  write_file_atomic(path, std::string_view("first"));
  EXPECT_EQ(read_bytes(path), "first");
  write_file_atomic(path, [](std::FILE* f) { std::fputs("second, longer", f); });
  EXPECT_EQ(read_bytes(path), "second, longer");
  EXPECT_EQ(dir.list(), std::vector<std::string>{"out.bin"});
}

TEST(AtomicFile, ThrowingWriterLeavesNothing) {
  TempDir dir;
  const std::string path = dir.file("out.bin");
  EXPECT_THROW(write_file_atomic(path,
                                 [](std::FILE* f) {
                                   std::fputs("partial", f);
                                   throw std::runtime_error("writer failed");
                                 }),
               std::runtime_error);
  EXPECT_TRUE(dir.list().empty());
}

TEST(AtomicFile, FailedWriteKeepsExistingFile) {
  TempDir dir;
  const std::string path = dir.file("out.bin");
  write_bytes(path, "old content");
  EXPECT_THROW(write_file_atomic(path, [](std::FILE*) { throw Error("no"); }), Error);
  EXPECT_EQ(read_bytes(path), "old content");
  EXPECT_EQ(dir.list(), std::vector<std::string>{"out.bin"});
}

TEST(AtomicFile, StreamErrorIsReportedWithPath) {
  TempDir dir;
  const std::string path = dir.file("out.bin");
  write_bytes(path, "old content");
  // Reading a write-only stream sets its error flag, as a failed fwrite would.
  std::string msg = error_of([&] { write_file_atomic(path, [](std::FILE* f) { std::fgetc(f); }); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_EQ(read_bytes(path), "old content");
  EXPECT_EQ(dir.list(), std::vector<std::string>{"out.bin"});
}

TEST(AtomicFile, MissingDirectoryNamesPathAndErrno) {
  TempDir dir;
  const std::string path = dir.file("no/such/dir/out.bin");
  std::string msg = error_of([&] { write_file_atomic(path, std::string_view("x")); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("No such file or directory"), std::string::npos) << msg;
}

}  // namespace
}  // namespace moe
