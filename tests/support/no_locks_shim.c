// LD_PRELOAD stand-in for a file system that refuses locks, as NFS without a lock daemon does:
// flock() and fcntl() record locks fail with ENOLCK (unlocking still works). Every refused call
// appends "CALL PID" to the file named by $NO_LOCKS_LOG, so a test can tell that the shim was in
// the way of a program that asked for a lock.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <unistd.h>

static void note(const char* call) {
  const char* log = getenv("NO_LOCKS_LOG");
  if (log == NULL || *log == '\0') return;
  const int saved = errno;
  const int fd = open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd >= 0) {
    dprintf(fd, "%s %d\n", call, (int)getpid());
    close(fd);
  }
  errno = saved;
}

int flock(int fd, int operation) {
  if ((operation & LOCK_UN) == 0) {
    note("flock");
    errno = ENOLCK;
    return -1;
  }
  int (*real)(int, int) = (int (*)(int, int))dlsym(RTLD_NEXT, "flock");
  return real(fd, operation);
}

// Whether fcntl's `cmd` with `arg` takes a record lock.
static int takes_lock(int cmd, void* arg) {
  const int locking = cmd == F_SETLK || cmd == F_SETLKW
#ifdef F_OFD_SETLK
                      || cmd == F_OFD_SETLK || cmd == F_OFD_SETLKW
#endif
      ;
  return locking && arg != NULL && ((struct flock*)arg)->l_type != F_UNLCK;
}

// fcntl's third argument is an int or a pointer; glibc passes it on as a pointer too.
static int forward(const char* name, int fd, int cmd, void* arg) {
  if (takes_lock(cmd, arg)) {
    note(name);
    errno = ENOLCK;
    return -1;
  }
  int (*real)(int, int, ...) = (int (*)(int, int, ...))dlsym(RTLD_NEXT, name);
  return real(fd, cmd, arg);
}

int fcntl(int fd, int cmd, ...) {
  va_list args;
  va_start(args, cmd);
  void* arg = va_arg(args, void*);
  va_end(args);
  return forward("fcntl", fd, cmd, arg);
}

// What programs built with 64-bit file offsets call (glibc 2.28 and later).
int fcntl64(int fd, int cmd, ...) {
  va_list args;
  va_start(args, cmd);
  void* arg = va_arg(args, void*);
  va_end(args);
  return forward("fcntl64", fd, cmd, arg);
}
