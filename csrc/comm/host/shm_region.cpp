#include "comm/host/shm_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "comm/transport.h"
#include "common/errors.h"

namespace overlap::comm {

namespace {

// Closes a file descriptor on scope exit; the mapping keeps the segment alive without it.
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

void* map_fd(int fd, std::size_t bytes, const std::string& name) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    OVERLAP_THROW(kSystem, "mmap of shared memory '" << name << "' (" << bytes << " bytes) failed: "
                                                     << detail::errno_string(err));
  }
  return p;
}

// NOTE [shm reservation]: ftruncate only sets a shared-memory file's size; tmpfs allocates its
// pages when they are first touched, and a page that no longer fits (the tmpfs is full, or
// smaller than the segment) kills the process with SIGBUS in the middle of some later op.
// Reserving every page at creation (posix_fallocate, which tmpfs supports) turns that into a
// typed error where the buffer is created, at the cost of committing the memory up front, which
// the buffer's ops write anyway. Verdict: reserve.
void reserve(int fd, std::size_t bytes, const std::string& name) {
  int err = 0;
  do {
    err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  } while (err == EINTR);
  OVERLAP_CHECK(err == 0, kSystem,
                "reserving " << bytes << " bytes of shared memory for '" << name
                             << "' failed: " << detail::errno_string(err)
                             << " (is /dev/shm large enough? `df -h /dev/shm` shows its free "
                                "space; docker: --shm-size)");
}

}  // namespace

ShmSegment::ShmSegment(std::string name, std::size_t bytes) : name_(std::move(name)), size_(bytes) {
  OVERLAP_CHECK_ARG(bytes > 0, "shared-memory segment '" << name_ << "' must not be empty");
  const int fd = ::shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  OVERLAP_CHECK_ERRNO(fd, "shm_open(O_CREAT | O_EXCL) of '" << name_ << "'");
  FdCloser closer{fd};
  linked_ = true;
  try {
    OVERLAP_CHECK(bytes <= static_cast<std::size_t>(std::numeric_limits<off_t>::max()), kSystem,
                  "shared-memory segment '" << name_ << "' of " << bytes
                                            << " bytes is larger than a file can be");
    OVERLAP_CHECK_ERRNO(::ftruncate(fd, static_cast<off_t>(bytes)),
                        "ftruncate of shared memory '" << name_ << "' to " << bytes
                                                       << " bytes (is /dev/shm large enough?)");
    reserve(fd, bytes, name_);
    data_ = map_fd(fd, bytes, name_);
  } catch (...) {
    unlink();
    throw;
  }
}

ShmSegment::~ShmSegment() {
  if (data_ != nullptr && ::munmap(data_, size_) != 0) {
    OVERLAP_WARN("munmap of shared memory '" << name_
                                             << "' failed: " << detail::errno_string(errno));
  }
  unlink();
}

void ShmSegment::unlink() {
  if (!linked_) return;
  linked_ = false;
  if (::shm_unlink(name_.c_str()) != 0 && errno != ENOENT) {
    OVERLAP_WARN("shm_unlink of '" << name_ << "' failed: " << detail::errno_string(errno));
  }
}

ShmMapping::ShmMapping(const std::string& name, std::size_t expected_bytes) {
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  OVERLAP_CHECK_ERRNO(fd, "shm_open of peer segment '" << name
                                                       << "' (is the peer on this host, and "
                                                          "has it already unlinked the name?)");
  FdCloser closer{fd};
  struct stat st {};
  OVERLAP_CHECK_ERRNO(::fstat(fd, &st), "fstat of peer segment '" << name << "'");
  // Only this user's ranks create our segments (mode 0600); root would open another user's.
  OVERLAP_CHECK(st.st_uid == ::geteuid(), kBootstrap,
                "peer segment '" << name << "' belongs to uid " << st.st_uid << ", not to uid "
                                 << ::geteuid() << " (this job's): refusing it");
  OVERLAP_CHECK_EQ(static_cast<std::size_t>(st.st_size), expected_bytes, kBootstrap,
                   "peer segment '" << name << "' has an unexpected size");
  data_ = map_fd(fd, expected_bytes, name);
  size_ = expected_bytes;
}

ShmMapping::~ShmMapping() {
  if (data_ != nullptr && ::munmap(data_, size_) != 0) {
    OVERLAP_WARN("munmap of a peer segment failed: " << detail::errno_string(errno));
  }
}

std::string shm_name(const std::string& tag) {
  return "/overlap-" + tag;
}

void unlink_shm(const std::string& name) noexcept {
  if (::shm_unlink(name.c_str()) != 0 && errno != ENOENT) {
    OVERLAP_WARN("shm_unlink of '" << name << "' failed: " << detail::errno_string(errno));
  }
}

std::string write_cookie(void* flags) {
  unsigned char bytes[kCookieBytes];
  std::size_t got = 0;
  while (got < kCookieBytes) {
    const ssize_t n = ::getrandom(bytes + got, kCookieBytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  if (got < kCookieBytes) {  // no getrandom (old kernel, seccomp): the library's source
    std::random_device rd;
    for (std::size_t i = got; i < kCookieBytes; ++i) bytes[i] = static_cast<unsigned char>(rd());
  }
  std::memcpy(static_cast<char*>(flags) + kCookieOffset, bytes, kCookieBytes);
  static const char* kHex = "0123456789abcdef";
  std::string hex;
  for (unsigned char b : bytes) {
    hex += kHex[b >> 4];
    hex += kHex[b & 15];
  }
  return hex;
}

void check_cookie(const void* flags, const std::string& cookie, const std::string& name) {
  const auto* bytes = static_cast<const unsigned char*>(flags) + kCookieOffset;
  static const char* kHex = "0123456789abcdef";
  std::string found;
  for (std::size_t i = 0; i < kCookieBytes; ++i) {
    found += kHex[bytes[i] >> 4];
    found += kHex[bytes[i] & 15];
  }
  OVERLAP_CHECK(found == cookie, kBootstrap,
                "peer segment '" << name
                                 << "' is not the one its rank created (its cookie differs from "
                                    "the one the rank sent through the bootstrap): another "
                                    "process created or replaced it; refusing it (NOTE "
                                    "[segment cookies])");
}

}  // namespace overlap::comm
