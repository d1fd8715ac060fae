/* LD_PRELOAD shim for the hang-watchdog test: slow storage, the long legitimate work that must not
 * be mistaken for a hang.
 *   MYRIAD_SLOW_FSYNC_SECONDS  fsync and fdatasync of a regular file of at least
 *   MYRIAD_SLOW_FSYNC_MIN_BYTES  bytes sleep this long first (a checkpoint shard on a slow disk);
 *   MYRIAD_SLOW_READ_SECONDS   pread of a file whose path contains
 *   MYRIAD_SLOW_READ_PATH      sleeps this long first (a data set on a slow file system).
 * Each delay is reported on stderr once per process, so the test can tell that it happened. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double env_seconds(const char* name) {
  const char* value = getenv(name);
  return value != NULL ? atof(value) : 0.0;
}

static void pause_for(double seconds, const char* what, int* reported) {
  if (seconds <= 0) return;
  if (!*reported) {
    *reported = 1;
    fprintf(stderr, "slow_io_shim: delaying %s by %g s\n", what, seconds);
  }
  struct timespec t = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
  while (nanosleep(&t, &t) != 0) {
  }
}

static void slow_sync(int fd) {
  static int reported = 0;
  struct stat st;
  const char* min_bytes = getenv("MYRIAD_SLOW_FSYNC_MIN_BYTES");
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return;
  if (min_bytes != NULL && st.st_size < atoll(min_bytes)) return;
  pause_for(env_seconds("MYRIAD_SLOW_FSYNC_SECONDS"), "fsync", &reported);
}

int fsync(int fd) {
  static int (*real)(int) = NULL;
  if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
  slow_sync(fd);
  return real(fd);
}

int fdatasync(int fd) {
  static int (*real)(int) = NULL;
  if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
  slow_sync(fd);
  return real(fd);
}

ssize_t pread(int fd, void* buffer, size_t count, off_t offset) {
  static ssize_t (*real)(int, void*, size_t, off_t) = NULL;
  static int reported = 0;
  if (real == NULL) real = (ssize_t(*)(int, void*, size_t, off_t))dlsym(RTLD_NEXT, "pread");
  const char* pattern = getenv("MYRIAD_SLOW_READ_PATH");
  if (pattern != NULL) {
    char link[64], path[PATH_MAX];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    const ssize_t n = readlink(link, path, sizeof(path) - 1);
    if (n > 0) {
      path[n] = '\0';
      if (strstr(path, pattern) != NULL)
        pause_for(env_seconds("MYRIAD_SLOW_READ_SECONDS"), "pread", &reported);
    }
  }
  return real(fd, buffer, count, offset);
}
