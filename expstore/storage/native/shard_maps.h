/* expstore.storage.native._kernels: frame shards read through memory mappings. Included
 * once, by ``shard_reads.h``, after ``pread_all``.
 *
 * A warm frame run read with ``pread`` spends most of its time in the system call (the
 * page cache's lookup, the copy out, the call itself): ~37% of a ``sample(256)`` of a
 * 100M-frame store in a ``perf`` profile. A run copied from a mapping of its shard costs a
 * memory access once the page is mapped. So a frame field's reads (one row per chunk) go
 * through a mapping of the file each descriptor holds:
 *
 * - made lazily, the first time a run of the shard is read through that descriptor, of
 *   the whole file as it is then, within a budget of mapped bytes (``state[ST_MAP_BUDGET]``,
 *   ``open(map_bytes=...)``); a run past the mapping's end (the file grew since) or a
 *   mapping refused is read with ``pread`` as before;
 * - unmapped when its descriptor is closed (``shard_close``: every place a descriptor of
 *   the table is closed), so a mapping never outlives the version it maps;
 * - copied with a guard against SIGBUS (``map_copy``): a page past the file's end (the
 *   writer rewrites a spare inode in place, truncating it first, and a reader may still
 *   hold that inode as an old version) or a disk error raises SIGBUS on the access where
 *   ``pread`` returns an error. The guarded copy then fails and the run is read with
 *   ``pread``, whose result the crc32c checks as always. A SIGBUS outside a guarded copy
 *   goes to the handler installed before this one (returning re-runs the faulting access
 *   under it) or, when none, kills the process as it would have.
 *
 * - on the read pool's path, copied only when their pages are in the page cache
 *   (``map_resident``, ``map_judged_warm``); the others go to the pool.
 *
 * Mapped pages are the page cache's own: they count in the process's RSS (``RssFile``),
 * not in its anonymous memory, and the kernel reclaims them like any cached page (but
 * ``posix_fadvise(DONTNEED)`` passes them by while they are mapped).
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>

/* the guarded copy running on this thread (NULL: none) */
static __thread sigjmp_buf *volatile map_guard = NULL;
static struct sigaction map_bus_before;
static int map_bus_state = 0; /* 0: handler not installed; 1: installed; -1: refused */
static pthread_mutex_t map_bus_lock = PTHREAD_MUTEX_INITIALIZER;

static void map_on_bus(int sig, siginfo_t *info, void *uctx) {
    sigjmp_buf *guard = map_guard;
    (void)uctx;
    if (guard) siglongjmp(*guard, 1);
    /* not a guarded copy: give the signal to the handler before ours */
    sigaction(SIGBUS, &map_bus_before, NULL);
    if (info == NULL || info->si_code <= 0) raise(sig); /* (sent, not a fault: send again) */
}

/* Install the SIGBUS guard once per process: 0 when mapped reads may be used. */
static int map_guard_ready(void) {
    if (map_bus_state) return map_bus_state > 0 ? 0 : -1;
    pthread_mutex_lock(&map_bus_lock);
    if (map_bus_state == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = map_on_bus;
        sa.sa_flags = SA_SIGINFO | SA_NODEFER; /* (left by siglongjmp: SIGBUS not blocked) */
        sigemptyset(&sa.sa_mask);
        map_bus_state = sigaction(SIGBUS, &sa, &map_bus_before) == 0 ? 1 : -1;
    }
    pthread_mutex_unlock(&map_bus_lock);
    return map_bus_state > 0 ? 0 : -1;
}

/* Copy `n` bytes from `src` (in a mapping) to `dst`: 0, or -1 when the access raised
   SIGBUS (the bytes are not there: past the file's end, or a disk error). */
static int map_copy(uint8_t *dst, const uint8_t *src, size_t n) {
    sigjmp_buf env;
    if (sigsetjmp(env, 0)) {
        map_guard = NULL;
        return -1;
    }
    map_guard = &env;
    memcpy(dst, src, n);
    map_guard = NULL;
    return 0;
}

/* Drop the mapping of the version open as `e` (a table row), if any. */
static void shard_unmap(int64_t *e, int64_t *state) {
    if (e[TAB_MAP_AT] > 0) {
        munmap((void *)(uintptr_t)e[TAB_MAP_AT], (size_t)e[TAB_MAP_LEN]);
        state[ST_MAPPED] -= e[TAB_MAP_LEN];
    }
    e[TAB_MAP_AT] = 0;
    e[TAB_MAP_LEN] = 0;
}

/* Close the descriptor of row `e` and drop its mapping. */
static void shard_close(int64_t *e, int64_t *state) {
    shard_unmap(e, state);
    if (e[TAB_FD] >= 0) close((int)e[TAB_FD]);
    e[TAB_FD] = -1;
}

/* The mapping of the file open as `e` when it covers bytes [0, end): made here the first
   time (within the budget); NULL when there is none (the caller reads with pread). */
static const uint8_t *shard_mapped(int64_t *e, int64_t *state, uint64_t end) {
    if (e[TAB_MAP_AT] == 0 && e[TAB_FD] >= 0) {
        struct stat st;
        if (fstat((int)e[TAB_FD], &st) != 0 || st.st_size <= 0) return NULL;
        int64_t len = (int64_t)st.st_size;
        if (state[ST_MAPPED] + len > state[ST_MAP_BUDGET]) return NULL; /* (maybe later) */
        if (map_guard_ready() != 0) {
            e[TAB_MAP_AT] = -1;
            return NULL;
        }
        void *at = mmap(NULL, (size_t)len, PROT_READ, MAP_SHARED, (int)e[TAB_FD], 0);
        if (at == MAP_FAILED) {
            e[TAB_MAP_AT] = -1; /* (not tried again through this descriptor) */
            return NULL;
        }
        e[TAB_MAP_AT] = (int64_t)(uintptr_t)at;
        e[TAB_MAP_LEN] = len;
        state[ST_MAPPED] += len;
    }
    if (e[TAB_MAP_AT] <= 0 || end > (uint64_t)e[TAB_MAP_LEN]) return NULL;
    return (const uint8_t *)(uintptr_t)e[TAB_MAP_AT];
}

/* Runs read through the pool's path (read_pool.h) are copied from their mapping only when
   their pages are in the page cache (a mapped page that is not would be read from the disk
   by the caller alone, where the pool reads many at once): asked of the cache with mincore
   (page-cache-only preads may be refused by the file system) until MAP_WARM_AFTER runs in
   a row were there, then only for one run in MAP_PROBE_EVERY, to notice a store gone
   cold. state[ST_WARM] counts those runs in a row. */
#define MAP_WARM_AFTER 64
#define MAP_PROBE_EVERY 64

static int map_judged_warm(const int64_t *state) {
    return state[ST_WARM] >= MAP_WARM_AFTER && state[ST_WARM] % MAP_PROBE_EVERY != 0;
}

/* Whether every page of bytes [off, off + len) of mapping `map` is in the page cache. */
static int map_resident(const uint8_t *map, uint64_t off, size_t len) {
    static long page = 0;
    if (page <= 0) page = sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096;
    uint64_t at = off - off % (uint64_t)page, last = off + len;
    unsigned char vec[64];
    while (at < last) { /* (64 pages per call) */
        uint64_t span = last - at < 64 * (uint64_t)page ? last - at : 64 * (uint64_t)page;
        size_t pages = (size_t)((span + (uint64_t)page - 1) / (uint64_t)page);
        if (mincore((void *)(map + at), (size_t)span, vec) != 0) return 0;
        for (size_t k = 0; k < pages; k++)
            if (!(vec[k] & 1)) return 0;
        at += span;
    }
    return 1;
}
