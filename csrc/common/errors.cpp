#include "common/errors.h"

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>

namespace overlap {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInternal:
      return "internal";
    case ErrorKind::kInvalidArgument:
      return "invalid argument";
    case ErrorKind::kConfig:
      return "config";
    case ErrorKind::kState:
      return "state";
    case ErrorKind::kTimeout:
      return "timeout";
    case ErrorKind::kUnsupported:
      return "unsupported";
    case ErrorKind::kCuda:
      return "cuda";
    case ErrorKind::kBootstrap:
      return "bootstrap";
    case ErrorKind::kSystem:
      return "system";
    case ErrorKind::kAborted:
      return "aborted";
  }
  return "unknown";
}

namespace {
std::atomic<int> g_log_level{static_cast<int>(LogLevel::kWarning)};
std::mutex g_log_mutex;

const char* basename_of(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}
}  // namespace

void set_log_level(LogLevel level) {
  g_log_level.store(static_cast<int>(level));
}
LogLevel log_level() {
  return static_cast<LogLevel>(g_log_level.load());
}

void log_message(LogLevel level, const std::string& message) {
  if (static_cast<int>(level) < g_log_level.load()) return;
  const char* tag = level >= LogLevel::kError     ? "ERROR"
                    : level >= LogLevel::kWarning ? "WARNING"
                    : level >= LogLevel::kInfo    ? "INFO"
                                                  : "DEBUG";
  std::lock_guard<std::mutex> lock(g_log_mutex);
  std::fprintf(stderr, "[overlap %s] %s\n", tag, message.c_str());
  std::fflush(stderr);
}

namespace detail {

void throw_error(ErrorKind kind, const char* file, int line, const char* func, const char* expr,
                 const std::string& message) {
  std::ostringstream oss;
  oss << message;
  if (expr != nullptr) oss << " [check failed: " << expr << "]";
  oss << " (at " << basename_of(file) << ":" << line << " in " << func << ")";
  throw Error(kind, oss.str());
}

void emit_warning(const char* file, int line, const std::string& message) {
  std::ostringstream oss;
  oss << message << " (at " << basename_of(file) << ":" << line << ")";
  log_message(LogLevel::kWarning, oss.str());
}

std::string errno_string(int err) {
  char buf[256];
  // GNU strerror_r may return a static string instead of filling buf.
  const char* s = strerror_r(err, buf, sizeof(buf));
  std::ostringstream oss;
  oss << s << " (errno " << err << ")";
  return oss.str();
}

}  // namespace detail
}  // namespace overlap
