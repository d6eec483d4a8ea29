#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace nextn {

namespace {

[[noreturn]] void fail(const std::string& what, const std::string& path, int err) {
  throw Error(what + " '" + path + "': " + std::strerror(err));
}

std::atomic<int> g_residency{-1};  // -1: not decided yet (NEXTN_WEIGHTS)

// size bytes of fd into fresh anonymous memory (read-only afterwards); null when that memory cannot be had.
// Throws on a read error.
const uint8_t* read_into_memory(int fd, size_t size, const std::string& path) {
  uint8_t* dst = map_huge_page_memory(size);  // (without THP the copy still avoids page-cache faults)
  if (dst == nullptr) return nullptr;
  for (size_t done = 0; done < size;) {
    const size_t chunk = std::min<size_t>(size - done, size_t(1) << 30);
    const ssize_t n = ::pread(fd, dst + done, chunk, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;  // (0: the file shrank while read)
      ::munmap(dst, size);
      fail("cannot read", path, err);
    }
    done += static_cast<size_t>(n);
  }
  (void)::mprotect(dst, size, PROT_READ);
  return dst;
}

}  // namespace

uint8_t* map_huge_page_memory(size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  (void)::madvise(p, bytes, MADV_HUGEPAGE);  // (advice)
  return static_cast<uint8_t*>(p);
}

void set_file_residency(FileResidency r) { g_residency = static_cast<int>(r); }

FileResidency file_residency() {
  int r = g_residency.load();
  if (r < 0) {
    const char* e = std::getenv("NEXTN_WEIGHTS");
    if (e != nullptr && *e != '\0' && std::strcmp(e, "memory") != 0 && std::strcmp(e, "mapped") != 0)
      throw Error(std::string("NEXTN_WEIGHTS='") + e + "': expected 'mapped' or 'memory'");
    r = e != nullptr && std::strcmp(e, "memory") == 0 ? 1 : 0;
    g_residency = r;
  }
  return r == 1 ? FileResidency::kInMemory : FileResidency::kMapped;
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  const bool want_memory = file_residency() == FileResidency::kInMemory;  // (may throw: before the file is open)
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) fail("cannot open", path, errno);

  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail("cannot stat", path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error("cannot map '" + path + "': not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (want_memory && size_ >= kInMemoryMinBytes) {
    try {
      data_ = read_into_memory(fd, size_, path);
    } catch (...) {
      ::close(fd);
      size_ = 0;
      throw;
    }
    in_memory_ = data_ != nullptr;
  }
  if (size_ > 0 && data_ == nullptr) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      size_ = 0;
      fail("cannot mmap", path, err);
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping stays valid after the descriptor is closed
}

MappedFile::~MappedFile() { release(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      in_memory_(std::exchange(other.in_memory_, false)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    in_memory_ = std::exchange(other.in_memory_, false);
  }
  return *this;
}

void MappedFile::release() noexcept {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
  in_memory_ = false;
}

}  // namespace nextn
