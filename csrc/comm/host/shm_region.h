// RAII owners of POSIX shared-memory segments (the host transport's memory).
#pragma once

#include <cstddef>
#include <string>

namespace overlap::comm {

// A segment this process created: shm_open(O_CREAT | O_EXCL, 0600) + ftruncate +
// posix_fallocate (NOTE [shm reservation] in shm_region.cpp) + mmap.
// NOTE [shm names]: the name is removed (shm_unlink) as soon as every peer has mapped it, so
// a crash afterwards leaks nothing; the destructor unlinks too if that never happened.
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

// A peer's segment opened by name and mapped here.
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

}  // namespace overlap::comm
