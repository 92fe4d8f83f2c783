// RAII owners of POSIX shared-memory segments (the host transport's memory).
#pragma once

#include <cstddef>
#include <string>

namespace overlap::comm {

// A segment this process created: shm_open(O_CREAT | O_EXCL, 0600: an existing name is an
// error) + ftruncate + posix_fallocate (NOTE [shm reservation] in shm_region.cpp) + mmap. The
// name is unlinked once every peer has mapped it, by the destructor otherwise, and by the live
// ranks of a failed rendezvous for every rank (NOTE [shm names] in overlap/comm/communicator.py).
class ShmSegment {
 public:
  ShmSegment(std::string name, std::size_t bytes);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  void* data() const { return data_; }
  std::size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  void unlink();  // idempotent

 private:
  std::string name_;
  std::size_t size_ = 0;
  void* data_ = nullptr;
  bool linked_ = false;
};

// A peer's segment opened by name and mapped here; refused unless this user owns it.
class ShmMapping {
 public:
  ShmMapping(const std::string& name, std::size_t expected_bytes);
  ~ShmMapping();
  ShmMapping(const ShmMapping&) = delete;
  ShmMapping& operator=(const ShmMapping&) = delete;

  void* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  std::size_t size_ = 0;
  void* data_ = nullptr;
};

// The shared-memory name of a region tagged `tag` (both transports): "/overlap-<tag>".
std::string shm_name(const std::string& tag);
// shm_unlink(name), where it exists; never throws.
void unlink_shm(const std::string& name) noexcept;

// NOTE [segment cookies] (comm/transport.h): a new random cookie (hex, from the kernel's random
// source), written into the flag page `flags` at kCookieOffset and returned.
std::string write_cookie(void* flags);
// Throws kBootstrap unless the flag page `flags` of the segment `name` holds `cookie`.
void check_cookie(const void* flags, const std::string& cookie, const std::string& name);

}  // namespace overlap::comm
