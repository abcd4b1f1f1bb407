/* expstore.storage.native._kernels: a batch's chunk reads issued concurrently. Included once, by
 * ``_kernels.c``, after ``shard_reads.h`` and ``decode_into``.
 *
 * On a cold store a frame's read is a disk read (~100-200 us), and ``read_rows`` used to
 * issue a batch's reads one after another (queue depth 1 per process). Here:
 *
 * - the read pool: ``depth - 1`` pthreads per process (the caller is the depth-th), each
 *   taking the next pread of a submitted batch; several callers (threads of one process)
 *   may submit at once, each batch using at most ``depth`` readers. Started lazily on the
 *   first batch that needs it, never inherited: a forked child (DataLoader workers) finds
 *   no pool (``pthread_atfork`` and a pid check) and starts its own. Its threads block
 *   every signal (Python's handlers run in the main thread). Depth 1: no threads at all.
 * - deferred runs (``pend_*``): ``read_rows`` on the frame path (one row per chunk, no
 *   chunks kept) records each run of chunks lying one after another in the file (a stack
 *   and its next frame: one read) with the rows it serves instead of reading it, then
 *   reads every recorded run through the pool, the caller decoding each run in order as
 *   soon as it is read, while later runs are in flight (``pend_flush``, ``pool_run``).
 *   A flush comes before any shard is opened (an open may close a descriptor a recorded
 *   run reads through), at the end of the call, and beyond ``PEND_BYTES`` recorded bytes.
 *   Each row's chunk offset and size are read from ``read_rows``' own per-position
 *   arrays, found once while its run was built (the remembered index entries are
 *   direct-mapped: a later row may overwrite them).
 *
 * Rows, bytes, reads counted, checks (crc32c, decode) and ``ok`` come out as at depth 1,
 * where ``read_rows`` reads as before (tests compare the two).
 */
#include <pthread.h>
#include <signal.h>
#include <sys/uio.h>

/* ---- the pool ----------------------------------------------------------------------- */

typedef struct {
    int fd;
    const uint8_t *map; /* the file's mapping when it covers the read (NULL: none) */
    uint8_t *buf;
    size_t len;
    int64_t off;
    int failed; /* pread failed or came back short */
    int done;   /* finished (set under the pool's lock) */
} pool_read;

typedef struct pool_batch {
    pool_read *reads;
    Py_ssize_t n, next, done; /* reads; next to claim; finished */
    int active, limit;        /* readers on it now; at most */
    int waiting;              /* its caller waits on `finished` */
    pthread_cond_t finished;  /* (signalled for its caller only) */
    struct pool_batch *link;  /* the queue of batches with reads not yet claimed */
} pool_batch;

typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t work; /* idle threads wait here; woken one per read to start */
    pool_batch *queue;
    int threads;
} read_pool;

static read_pool *pool_now = NULL; /* this process's pool (NULL: none started) */
static pid_t pool_pid = 0;         /* the process that started it */
static pthread_mutex_t pool_start_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t pool_fork_once = PTHREAD_ONCE_INIT;
/* preads in flight per batch read unless set_read_depth / EXPSTORE_READ_DEPTH says otherwise
   (benchmarks/bench_cold.py, 2-core VM, virtio disk: random reads/s level off from queue
   depth 16-32; make_loader cold at 16 per worker was 5-15% above 8 in three of three
   runs, 1.4-2.9x depth 1, at the same CPU per transition) */
#define READ_DEPTH_DEFAULT 16
static int read_depth = READ_DEPTH_DEFAULT;
#define READ_DEPTH_MAX 256

/* in a forked child the parent's threads are gone and its locks may be held: forget the
   pool (its memory stays, unused) and start a new one when needed */
static void pool_after_fork(void) {
    pool_now = NULL;
    pool_pid = 0;
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    pool_start_lock = fresh;
}

static void pool_register_fork(void) { pthread_atfork(NULL, NULL, pool_after_fork); }

static void pool_do(pool_read *r) {
    r->failed = pread_all(r->fd, r->buf, r->len, r->off) != 0;
}

/* the first queued batch a reader may join (under the pool lock), or NULL */
static pool_batch *pool_claimable(read_pool *p) {
    for (pool_batch *b = p->queue; b; b = b->link)
        if (b->next < b->n && b->active < b->limit) return b;
    return NULL;
}

/* take read `b->next` (under the lock); unlink the batch once every read is taken */
static Py_ssize_t pool_claim(read_pool *p, pool_batch *b) {
    Py_ssize_t i = b->next++;
    b->active++;
    if (b->next == b->n)
        for (pool_batch **at = &p->queue; *at; at = &(*at)->link)
            if (*at == b) {
                *at = b->link;
                break;
            }
    return i;
}

/* (a finished read wakes the batch's caller when it waits: it may decode it, read next,
   or return) */
static void pool_finish(read_pool *p, pool_batch *b, Py_ssize_t i) {
    b->reads[i].done = 1;
    b->active--;
    b->done++;
    if (b->waiting) pthread_cond_signal(&b->finished);
}

static void *pool_thread(void *arg) {
    read_pool *p = arg;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        pool_batch *b;
        while ((b = pool_claimable(p)) == NULL) pthread_cond_wait(&p->work, &p->lock);
        Py_ssize_t i = pool_claim(p, b);
        pthread_mutex_unlock(&p->lock);
        pool_do(&b->reads[i]);
        pthread_mutex_lock(&p->lock);
        pool_finish(p, b, i);
    }
    return NULL;
}

/* This process's pool with at least `want` threads (started or grown here), or NULL when
   none could be started (the caller then reads alone). */
static read_pool *pool_get(int want) {
    pthread_once(&pool_fork_once, pool_register_fork);
    pthread_mutex_lock(&pool_start_lock);
    if (pool_now && pool_pid != getpid()) pool_now = NULL; /* (a fork without atfork) */
    read_pool *p = pool_now;
    if (!p) {
        p = calloc(1, sizeof *p);
        if (p && (pthread_mutex_init(&p->lock, NULL) || pthread_cond_init(&p->work, NULL))) {
            free(p);
            p = NULL;
        }
        pool_now = p;
        pool_pid = getpid();
    }
    if (p && p->threads < want) {
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &old);
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 256 * 1024);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_mutex_lock(&p->lock);
        while (p->threads < want) {
            pthread_t t;
            if (pthread_create(&t, &attr, pool_thread, p) != 0) break;
            p->threads++;
        }
        pthread_mutex_unlock(&p->lock);
        pthread_attr_destroy(&attr);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    pthread_mutex_unlock(&pool_start_lock);
    return p;
}

/* what the caller does with read i once reads 0..i are done (in order) */
typedef void (*pool_consume)(void *ctx, Py_ssize_t i);

/* Every read of `reads` (n), at most `depth` in flight, each handed to `consume` in order
   as soon as it and those before it are done: the caller decodes read k while later reads
   are in flight, and reads itself when it has nothing to decode. Without the GIL. */
static void pool_run(pool_read *reads, Py_ssize_t n, int depth, pool_consume consume,
                     void *ctx) {
    read_pool *p = depth > 1 && n > 1 ? pool_get(depth - 1) : NULL;
    pool_batch b = {reads, n, 0, 0, 0, depth, 1};
    if (!p || pthread_cond_init(&b.finished, NULL) != 0) {
        for (Py_ssize_t i = 0; i < n; i++) {
            pool_do(&reads[i]);
            consume(ctx, i);
        }
        return;
    }
    pthread_mutex_lock(&p->lock);
    pool_batch **tail = &p->queue;
    while (*tail) tail = &(*tail)->link;
    *tail = &b;
    /* wake as many threads as may help: no more (a 2-core machine pays for each switch) */
    for (Py_ssize_t k = 1; k < n && k < depth; k++) pthread_cond_signal(&p->work);
    for (Py_ssize_t k = 0; k < n;) {
        if (reads[k].done) {
            pthread_mutex_unlock(&p->lock);
            consume(ctx, k++);
            pthread_mutex_lock(&p->lock);
        } else if (b.next < b.n && b.active < b.limit) { /* the caller reads too */
            Py_ssize_t i = pool_claim(p, &b);
            pthread_mutex_unlock(&p->lock);
            pool_do(&reads[i]);
            pthread_mutex_lock(&p->lock);
            pool_finish(p, &b, i);
        } else {
            pthread_cond_wait(&b.finished, &p->lock);
        }
    }
    /* (every read is done and was claimed: no pool thread refers to `b` any more) */
    pthread_mutex_unlock(&p->lock);
    pthread_cond_destroy(&b.finished);
}

/* ---- deferred runs of read_rows ------------------------------------------------------ */

/* recorded bytes beyond which the runs are read and decoded before more are recorded */
#define PEND_BYTES (16u << 20)

typedef struct {
    pool_read *reads;  /* one per run (buf: an offset into `blob` until the flush) */
    Py_ssize_t *first; /* per run: its first and last position in read order */
    Py_ssize_t *last;
    Py_ssize_t n, cap;
    /* per position in read order: the row's chunk (read_rows' run_off / run_nb, each
       written once, while its run is built) */
    const uint64_t *row_off, *row_nb;
    scratch_t blob;
    size_t used;
} pending_runs;

static void pend_init(pending_runs *pr, const uint64_t *row_off, const uint64_t *row_nb) {
    memset(pr, 0, sizeof *pr);
    pr->row_off = row_off;
    pr->row_nb = row_nb;
}

static void pend_free(pending_runs *pr) {
    free(pr->reads);
    free(pr->first);
    free(pr->blob.buf);
}

/* Record one run: `len` bytes at `off` of `fd`, serving read-order positions p..q. -1 when
   out of memory (the rows are left to the caller, as after a failed read). */
static int pend_add(pending_runs *pr, int fd, const uint8_t *map, uint64_t off, size_t len,
                    Py_ssize_t p, Py_ssize_t q) {
    if (pr->n == pr->cap) {
        Py_ssize_t cap = pr->cap ? 2 * pr->cap : 64;
        pool_read *r = realloc(pr->reads, (size_t)cap * sizeof *r);
        if (!r) return -1;
        pr->reads = r;
        Py_ssize_t *f = realloc(pr->first, (size_t)cap * 2 * sizeof *f);
        if (!f) return -1;
        memmove(f + cap, f + pr->cap, (size_t)pr->n * sizeof *f); /* the `last` half */
        pr->first = f;
        pr->last = f + cap;
        pr->cap = cap;
    }
    if (scratch_reserve(&pr->blob, pr->used + len) != 0) return -1;
    pool_read *r = &pr->reads[pr->n];
    r->fd = fd;
    r->map = map;
    r->buf = (uint8_t *)(uintptr_t)pr->used; /* made a pointer by the flush */
    r->len = len;
    r->off = (int64_t)off;
    r->failed = 0;
    r->done = 0;
    pr->first[pr->n] = p;
    pr->last[pr->n] = q;
    pr->n++;
    pr->used += len;
    return 0;
}

/* what decoding a recorded run needs (pend_flush) */
typedef struct {
    pending_runs *pr;
    const read_order *ord;
    const int64_t *dst;
    uint8_t *o, *ok;
    Py_ssize_t row_bytes;
    int checksum, *status;
    long long *total;
    scratch_t *tmp;
} run_decode;

/* Decode the rows of run r (read) into their places, as read_rows does at depth 1. */
static void pend_decode(void *ctx, Py_ssize_t r) {
    run_decode *d = ctx;
    const pool_read *rd = &d->pr->reads[r];
    if (rd->failed || *d->status != STATUS_OK) return;
    *d->total += (long long)rd->len;
    for (Py_ssize_t k = d->pr->first[r]; k <= d->pr->last[r] && *d->status == STATUS_OK; k++) {
        Py_ssize_t j = d->ord[k].i;
        int st = decode_into(rd->buf + (d->pr->row_off[k] - (uint64_t)rd->off),
                             (size_t)d->pr->row_nb[k], d->checksum, 1, (size_t)d->row_bytes,
                             0, (size_t)d->row_bytes, d->o + d->dst[j] * d->row_bytes, d->tmp);
        if (st == STATUS_UNSUPPORTED) *d->status = st;
        d->ok[j] = st == STATUS_OK;
    }
}

/* the runs left to the pool: io[t] is run todo[t] */
typedef struct {
    run_decode *d;
    pool_read *io;
    const Py_ssize_t *todo;
} run_todo;

static void pend_decode_todo(void *ctx, Py_ssize_t t) {
    run_todo *w = ctx;
    w->d->pr->reads[w->todo[t]].failed = w->io[t].failed;
    pend_decode(w->d, w->todo[t]);
}

#ifdef RWF_NOWAIT
static int nowait_works = 1; /* cleared where the kernel or filesystem refuses the flag */
#endif

/* Read run `r` at once when every byte is in the page cache (preadv2 RWF_NOWAIT): 1 when
   read, 0 when it needs the disk (or the flag is not supported). */
static int read_if_cached(pool_read *r) {
#ifdef RWF_NOWAIT
    if (!nowait_works) return 0;
    struct iovec v = {r->buf, r->len};
    ssize_t got = preadv2(r->fd, &v, 1, (off_t)r->off, RWF_NOWAIT);
    if (got < 0 && (errno == EOPNOTSUPP || errno == ENOSYS || errno == EINVAL))
        nowait_works = 0;
    return got == (ssize_t)r->len;
#else
    (void)r;
    return 0;
#endif
}

/* Read run `r` at once when its bytes are in the page cache: from its mapping (asking the
   cache with mincore, except while the judge counts the store warm: shard_maps.h), else
   with a page-cache-only pread (read_if_cached). 1 when read, 0 when it needs the disk. */
static int read_warm(pool_read *r, int64_t *state) {
    if (r->map) {
        if (!map_judged_warm(state) && !map_resident(r->map, (uint64_t)r->off, r->len)) {
            state[ST_WARM] = 0;
            return 0;
        }
        if (map_copy(r->buf, r->map + r->off, r->len) == 0) {
            state[ST_WARM]++;
            state[ST_MAP_READS]++;
            return 1;
        }
        /* (SIGBUS: the bytes are not there; pread says so) */
    }
    return read_if_cached(r);
}

/* Read every recorded run and decode its rows into their places: runs whose bytes are all
   in the page cache at once, by the caller (a warm batch wakes no thread; read_warm), the
   others through the pool (at most `depth` in flight), each decoded as soon as it is read.
   The runs are then forgotten. */
static void pend_flush(pending_runs *pr, int depth, const read_order *ord, const int64_t *dst,
                       uint8_t *o, Py_ssize_t row_bytes, int checksum, uint8_t *ok,
                       int *status, long long *total, scratch_t *tmp, int64_t *state) {
    if (pr->n == 0) return;
    for (Py_ssize_t r = 0; r < pr->n; r++)
        pr->reads[r].buf = pr->blob.buf + (uintptr_t)pr->reads[r].buf;
    /* a warm store's runs: their first and last lines asked of the memory at once, before
       any is copied. Each copy from a mapping otherwise waited alone on its page's walk and
       its line in RAM (a 100M-frame sample(256): memmove 16% of the samples, 77% of them
       on its first load; with this 6.6%, and the batch 14-16% faster, shard_reads.h) */
    if (map_judged_warm(state))
        for (Py_ssize_t r = 0; r < pr->n; r++) {
            const pool_read *rd = &pr->reads[r];
            if (!rd->map) continue;
            __builtin_prefetch(rd->map + rd->off);
            __builtin_prefetch(rd->map + rd->off + rd->len - 1);
        }
    run_decode d = {pr, ord, dst, o, ok, row_bytes, checksum, status, total, tmp};
    Py_ssize_t *todo = malloc((size_t)pr->n * sizeof *todo);
    pool_read *io = malloc((size_t)pr->n * sizeof *io);
    if (!todo || !io) { /* (no room to sort them: all through the pool) */
        pool_run(pr->reads, pr->n, depth, pend_decode, &d);
    } else {
        Py_ssize_t m = 0;
        for (Py_ssize_t r = 0; r < pr->n; r++) {
            if (read_warm(&pr->reads[r], state)) {
                pend_decode(&d, r);
            } else {
                todo[m] = r;
                io[m++] = pr->reads[r];
            }
        }
        run_todo w = {&d, io, todo};
        pool_run(io, m, depth, pend_decode_todo, &w);
    }
    free(todo);
    free(io);
    pr->n = 0;
    pr->used = 0;
}

/* ---- Python face ----------------------------------------------------------------------- */

static PyObject *set_read_depth(PyObject *self, PyObject *arg) {
    long depth = PyLong_AsLong(arg);
    if (depth == -1 && PyErr_Occurred()) return NULL;
    if (depth < 1 || depth > READ_DEPTH_MAX) {
        PyErr_Format(PyExc_ValueError, "read depth: expected an integer from 1 to %d, got %ld",
                     READ_DEPTH_MAX, depth);
        return NULL;
    }
    int before = read_depth;
    read_depth = (int)depth;
    return PyLong_FromLong(before);
}

static PyObject *get_read_depth(PyObject *self, PyObject *unused) {
    return PyLong_FromLong(read_depth);
}

static PyObject *read_pool_threads(PyObject *self, PyObject *unused) {
    int n = 0;
    pthread_mutex_lock(&pool_start_lock);
    if (pool_now && pool_pid == getpid()) n = pool_now->threads;
    pthread_mutex_unlock(&pool_start_lock);
    return PyLong_FromLong(n);
}
