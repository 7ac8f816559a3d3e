// FileSizeLimit: while it lives, a file may not grow past `limit` bytes (RLIMIT_FSIZE) and the process ignores
// SIGXFSZ, so a write or preallocation past it fails with EFBIG as on a full disk instead of killing the
// process. A genuine failure in the middle of a save, which works even for root (unlike a read-only
// directory). Each test runs in its own process under ctest, so the limit touches no other test.
#pragma once

#include <signal.h>
#include <sys/resource.h>

namespace memtrain::test_support {

class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t limit) {
    old_handler_ = ::signal(SIGXFSZ, SIG_IGN);
    ::getrlimit(RLIMIT_FSIZE, &old_);
    rlimit r = old_;
    r.rlim_cur = limit;
    ok_ = ::setrlimit(RLIMIT_FSIZE, &r) == 0;
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    ::signal(SIGXFSZ, old_handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;
  bool ok() const { return ok_; }

 private:
  rlimit old_{};
  sighandler_t old_handler_ = SIG_DFL;
  bool ok_ = false;
};

}  // namespace memtrain::test_support
