// Atomic file replacement: a reader of `path` sees the old file or the whole
// new one, never a prefix, even if the process or machine dies mid-write.
//
// Recipe: write a temporary file in the same directory (same filesystem, so
// rename is atomic), fflush + fsync it, close, rename it over `path`, then
// fsync the directory so the rename itself is durable.
#pragma once

#include <cstdio>
#include <functional>
#include <string>
#include <string_view>

namespace moe {

// Calls writer(f) on a fresh temporary file, then moves it to `path`.
// On any failure (I/O error, or an exception from `writer`) the temporary
// file is removed and `path` is left as it was; I/O errors throw moe::Error
// naming `path` and the errno text, writer exceptions propagate unchanged.
// The writer may simply fwrite: stream errors are detected after it returns.
void write_file_atomic(const std::string& path, const std::function<void(std::FILE*)>& writer);

// Same, with the whole content given.
void write_file_atomic(const std::string& path, std::string_view bytes);

// Creates directory `dir` and its parents where missing. Throws moe::Error
// "<what>: ..." naming `dir` when it (or a parent) exists as something other
// than a directory or cannot be made (`what` names the option: "--trace-dir",
// "metrics_file /x/m.jsonl").
void ensure_directory(const std::string& dir, const std::string& what);

}  // namespace moe
