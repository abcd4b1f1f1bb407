/* expstore.storage.native._kernels: the shard bookkeeping of ``read_rows``. Included once, by
 * ``_kernels.c``, after the decoders it uses.
 *
 * - open_shard / holds: the descriptors read_rows keeps per shard (``tab``, ``ring``).
 * - sort_rows: a call's rows in (shard, slot) order, so that one shard's rows come one
 *   after another: the index entries of a 4 KiB page of chunks are read with one pread
 *   and remembered (chunk_entry), and chunks lying one after another in the file (gaps of
 *   < 4 KiB included) with one more (a stack of 4 frames and its next frame: one read
 *   once its entries are remembered, 2 before, not 10).
 * - entry_held / entry_load: frames of many chunks (more than the entry cache holds) keep
 *   whole shards' indexes compactly instead, within a budget: one read per frame run.
 * - held chunks: for fields of one multi-row chunk per shard (scalars) whose decoded
 *   values do not fit their budget, the compressed chunk of each shard read is kept in a
 *   byte arena (a ring: the oldest chunks are overwritten first) with the version it came
 *   from; a later row of that version is decoded from RAM, with no descriptor and no read.
 */

/* Columns of the per-shard table `tab` (int64, n_shards x TAB_COLS) that read_rows keeps:
   the descriptor it holds open for the shard (-1: none), the first lane step and row count
   of that version's header, the committed count that version is trusted for, and the
   shard's position in `ring` (the open descriptors, closed oldest first beyond its size),
   and the number of the open (state[2] counts them) that got the descriptor: index entries
   remembered in `ecache` are used only with the descriptor they were read through; and
   the file's mapping made through that descriptor (address, 0: none, -1: refused; bytes),
   unmapped when it is closed (shard_maps.h). */
enum {
    TAB_FD = 0, TAB_FIRST = 1, TAB_NROWS = 2, TAB_TRUSTED = 3, TAB_RINGPOS = 4, TAB_GEN = 5,
    TAB_MAP_AT = 6, TAB_MAP_LEN = 7, TAB_COLS = 8
};
/* Entries of `state` (int64, STATE_LEN): ring positions used, the next to reuse, opens so
   far; bytes mapped now, the most that may be (shard_maps.h), the judge's count of warm
   runs in a row, and runs read through a mapping so far. */
enum {
    ST_USED = 0, ST_NEXT = 1, ST_OPENS = 2, ST_MAPPED = 3, ST_MAP_BUDGET = 4, ST_WARM = 5,
    ST_MAP_READS = 6, STATE_LEN = 7
};
/* Columns of `ecache` (int64, E x ECACHE_COLS), direct-mapped by chunk (shard * n_chunks +
   chunk): the chunk's number, the open it was read through, its offset and size. */
enum { EC_KEY = 0, EC_GEN = 1, EC_OFF = 2, EC_NB = 3, ECACHE_COLS = 4 };

#define SHARD_MAGIC "EXPS"
#define SHARD_HEADER 32
#define SHARD_FORMAT_VERSION 1
#define SHARD_CHECKSUMS 1

static int pread_all(int fd, uint8_t *buf, size_t want, int64_t at) {
    size_t got = 0;
    while (got < want) {
        ssize_t r = pread(fd, buf + got, want - got, (off_t)(at + (int64_t)got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

static uint64_t le64(const uint8_t *p) {
    return (uint64_t)le32(p) | ((uint64_t)le32(p + 4) << 32);
}

#include "shard_maps.h" /* shard_mapped, map_copy, shard_close */

/* Flags a shard is opened with for reading: without access-time updates (a read of a warm
   page otherwise spends ~5% of its time in touch_atime) where the process may ask that
   (O_NOATIME: the files' owner, or CAP_FOWNER); cleared at the first EPERM. */
#ifdef O_NOATIME
static volatile int open_noatime = O_NOATIME;
#else
static volatile int open_noatime = 0;
#endif

static int open_for_reads(const char *path) {
    int extra = open_noatime;
    int fd = open(path, O_RDONLY | O_CLOEXEC | extra);
    if (fd < 0 && errno == EPERM && extra) {
        open_noatime = 0;
        fd = open(path, O_RDONLY | O_CLOEXEC);
    }
    return fd;
}

/* Open shard `shard` (path prefix + number + suffix), read and check its header (magic,
   format version, crc32c), and record it in row `e` of the table, taking a ring position
   (closing the oldest descriptor when the ring is full). 0 on success, -1 when the shard
   is missing or its header does not check (the caller's general path retries and
   reports). */
static int open_shard(const char *prefix, const char *suffix, int64_t shard, int64_t hoff,
                      int64_t trusted, int64_t *tab, int64_t *ring, int64_t ring_n,
                      int64_t *state) {
    int64_t *e = tab + shard * TAB_COLS;
    if (e[TAB_FD] >= 0) shard_close(e, state);
    char path[4096];
    int len = snprintf(path, sizeof path, "%s%lld%s", prefix, (long long)shard, suffix);
    if (len < 0 || (size_t)len >= sizeof path) return -1;
    int fd = open_for_reads(path);
    /* out of descriptors (the process holds others too): close this table's oldest */
    for (int tries = 0; fd < 0 && (errno == EMFILE || errno == ENFILE) && tries < 8; tries++) {
        int closed = 0;
        for (int64_t k = 0; k < state[0] && !closed; k++) {
            int64_t at = (state[1] + k) % ring_n, victim = ring[at];
            if (victim < 0 || victim == shard) continue;
            int64_t *v = tab + victim * TAB_COLS;
            if (v[TAB_RINGPOS] == at && v[TAB_FD] >= 0) {
                shard_close(v, state);
                closed = 1;
            }
        }
        if (!closed) break;
        fd = open_for_reads(path);
    }
    if (fd < 0) return -1;
    uint8_t h[SHARD_HEADER];
    if (pread_all(fd, h, SHARD_HEADER, hoff) != 0 || memcmp(h, SHARD_MAGIC, 4) != 0) {
        close(fd);
        return -1;
    }
    unsigned version = (unsigned)h[4] | ((unsigned)h[5] << 8);
    unsigned flags = (unsigned)h[6] | ((unsigned)h[7] << 8);
    uint32_t crc = le32(h + 20);
    if (version > SHARD_FORMAT_VERSION) {
        close(fd);
        return -1;
    }
    if ((flags & SHARD_CHECKSUMS) || crc) {
        uint8_t body[SHARD_HEADER - 4];
        memcpy(body, h, 20);
        memcpy(body + 20, h + 24, SHARD_HEADER - 24);
        if (crc32c(body, sizeof body) != crc) {
            close(fd);
            return -1;
        }
    }
    int64_t k = e[TAB_RINGPOS];
    if (k < 0 || k >= ring_n || ring[k] != shard) { /* a new ring position */
        if (state[0] < ring_n) {
            k = state[0]++;
        } else {
            k = state[1];
            state[1] = (state[1] + 1) % ring_n;
            int64_t victim = ring[k];
            if (victim >= 0) {
                int64_t *v = tab + victim * TAB_COLS;
                if (v[TAB_RINGPOS] == k) {
                    if (v[TAB_FD] >= 0) shard_close(v, state);
                    v[TAB_RINGPOS] = -1;
                }
            }
        }
        ring[k] = shard;
        e[TAB_RINGPOS] = k;
    }
    e[TAB_FD] = fd;
    e[TAB_FIRST] = (int64_t)le64(h + 8);
    e[TAB_NROWS] = (int64_t)(int32_t)le32(h + 16);
    e[TAB_TRUSTED] = trusted;
    e[TAB_GEN] = ++state[2];
    return 0;
}

static int holds(const int64_t *e, int64_t slot, int64_t step) {
    return e[TAB_FD] >= 0 && e[TAB_FIRST] + slot == step && slot < e[TAB_NROWS] &&
           step < e[TAB_TRUSTED];
}

/* ---- rows in (shard, slot) order -------------------------------------------------- */

typedef struct {
    int64_t key;   /* shard * rows per shard + slot */
    Py_ssize_t i;  /* the row's place in the call */
} read_order;

static int cmp_order(const void *a, const void *b) {
    const read_order *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

/* bits of the key a pass of the radix sort takes (a 2,048-entry count per pass) */
#define SORT_DIGIT 11

/* `ord` by key, equal keys in their first order, through `tmp` (n entries): least
   significant digit first, as many passes as the largest key needs (3 at 100M rows). A
   batch of 1,280 rows took qsort ~5% of a `sample(256)` at 100M. 0, or -1 (keys < 0). */
static int radix_rows(read_order *ord, read_order *tmp, Py_ssize_t n) {
    int64_t most = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (ord[i].key < 0) return -1;
        if (ord[i].key > most) most = ord[i].key;
    }
    Py_ssize_t count[1 << SORT_DIGIT];
    read_order *from = ord, *to = tmp;
    for (int shift = 0; shift < 64 && (shift == 0 || (most >> shift) > 0);
         shift += SORT_DIGIT) {
        memset(count, 0, sizeof count);
        for (Py_ssize_t i = 0; i < n; i++)
            count[(from[i].key >> shift) & ((1 << SORT_DIGIT) - 1)]++;
        Py_ssize_t at = 0;
        for (int d = 0; d < (1 << SORT_DIGIT); d++) {
            Py_ssize_t c = count[d];
            count[d] = at;
            at += c;
        }
        for (Py_ssize_t i = 0; i < n; i++)
            to[count[(from[i].key >> shift) & ((1 << SORT_DIGIT) - 1)]++] = from[i];
        read_order *t = from;
        from = to;
        to = t;
    }
    if (from != ord) memcpy(ord, from, (size_t)n * sizeof *ord);
    return 0;
}

static void sort_rows(read_order *ord, const int64_t *shards, const int64_t *slots,
                      Py_ssize_t n, int64_t shard_rows) {
    int sorted = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        ord[i].key = shards[i] * shard_rows + slots[i];
        ord[i].i = i;
        if (i && ord[i].key < ord[i - 1].key) sorted = 0;
    }
    if (sorted) return;
    read_order *tmp = n >= 64 ? malloc((size_t)n * sizeof *tmp) : NULL;
    if (!tmp || radix_rows(ord, tmp, n) != 0) qsort(ord, (size_t)n, sizeof *ord, cmp_order);
    free(tmp);
}

/* ---- index entries ------------------------------------------------------------------ */

/* index entries read with one pread at most (4 KiB, one page: the index starts the file) */
#define ENTRY_RUN 256

static int entry_ok(uint64_t off, uint64_t nb, uint64_t max_blob, int64_t hoff) {
    return off != UINT64_MAX && nb != 0 && nb <= max_blob &&
           off >= (uint64_t)hoff + SHARD_HEADER;
}

/* The remembered entry of chunk `c` of `shard` (read through the descriptor of open
   `gen`), or NULL. */
static const int64_t *remembered(const int64_t *ec, Py_ssize_t ec_n, int64_t shard,
                                 int64_t n_chunks, int64_t c, int64_t gen) {
    if (!ec) return NULL;
    int64_t key = shard * n_chunks + c;
    const int64_t *ce = ec + (key % ec_n) * ECACHE_COLS;
    return ce[EC_KEY] == key && ce[EC_GEN] == gen ? ce : NULL;
}

/* Entries remembered with each index read of a field whose chunks outnumber its entry
   cache 4 to 1 (ENTRY_WINDOW, from `c` rounded down to 16): a later batch seldom finds a
   page of them again, so only those the rest of this run needs (a frame stack and the
   next frames) are stored, not the page's 256 (storing those was the largest part of the
   kernel's own time in a profile of a 100M-frame store). */
#define ENTRY_WINDOW 32

/* How many entries one index read remembers for a field of `total` chunks, `ec_n` of
   which the entry cache holds: its whole 4 KiB page while most of the field fits. */
static int64_t entry_span(int64_t total, Py_ssize_t ec_n) {
    return total <= 4 * (int64_t)ec_n ? ENTRY_RUN : ENTRY_WINDOW;
}

/* ---- whole shards' index entries (frames of many chunks) ---------------------------- */

/* A field of one row per chunk (frames) whose chunks outnumber the entry cache (``ecache``,
 * direct-mapped, 32 B per entry) reads a chunk's index entry with a pread of its own before
 * the chunk itself: at 100M small frames half of a batch's reads. This table holds whole
 * shards' indexes compactly instead, 2.29 B per chunk: per block of EBLOCK chunks, one
 * 64-byte cache line holding the offset of its first chunk (u64) and each chunk's size
 * (u16), so a lookup touches one line in RAM, not two (an array of offsets and one of
 * sizes, as the table first was: independent loads whose misses overlapped, so this saves
 * less than a miss; ``entry_known`` went from ~8.2% to ~7.1% of a 100M-frame
 * ``sample(256)``). A chunk's offset is its block's plus the sizes
 * before it in the block, which holds where a shard's chunks lie one
 * after another in the file (a shard written by ``ShardImage``: frames are appended in
 * order). A block where they do not (a missing chunk, a chunk of 64 KiB or more, a gap) is
 * not held: its chunks take the entry cache's path.
 *
 * A shard's index is loaded with one pread of the whole index and its crc32c checked (a
 * torn or damaged index is not held), the first time a complete version (every row
 * written; a partial one is still being extended by its writer) is asked for. Each shard
 * loaded keeps its slot, of `k_n` (the table's memory budget), for its later versions;
 * once they are all taken, other shards are not held (no slot is given up: a ring of whole
 * indexes read again and again would cost more than it saves). An index is used only with
 * the descriptor it was read through (the open's number, as the entry cache does): a shard
 * opened again (a new version) loads again.
 */

#define EBLOCK 28       /* chunks a block: its first offset and 28 sizes fill one line */
#define EBLOCK_BYTES 64 /* a block's bytes: u64 first offset (UINT64_MAX: not held), u16 sizes */
enum { EOF_SLOT = 0, EOF_GEN = 1, EOF_TRIED = 2, EOF_COLS = 3 };

typedef struct {
    uint8_t *blk;    /* k_n x n_blocks blocks of EBLOCK_BYTES, 64-byte aligned: each the
                        offset of its first chunk, then the chunks' sizes (crc32c included) */
    int64_t *of;     /* n_shards x EOF_COLS: the shard's slot (-1: none), the open its
                        slot's index was loaded through, the open last tried (-1: none) */
    int64_t *st;     /* slots taken */
    int64_t k_n, n_blocks;
} entry_table;

/* The held entry block of chunk `c` of `shard` open as `e`, or NULL where its index is
   not held through that open (entry_held reads it; read_rows asks for a call's blocks
   ahead with it). */
static inline const uint8_t *entry_block(const entry_table *et, const int64_t *e,
                                         int64_t shard, int64_t c) {
    const int64_t *of = et->of + EOF_COLS * shard;
    if (of[EOF_SLOT] < 0 || of[EOF_GEN] != e[TAB_GEN]) return NULL;
    return et->blk + ((size_t)of[EOF_SLOT] * (size_t)et->n_blocks + (size_t)(c / EBLOCK)) *
                         EBLOCK_BYTES;
}

/* Offset and size of chunk `c` of `shard` open as `e`, from its held index: 1 when held. */
static int entry_held(const entry_table *et, const int64_t *e, int64_t shard, int64_t c,
                      uint64_t *off, uint64_t *nb) {
    if (!et || !et->blk) return 0;
    const uint8_t *b = entry_block(et, e, shard, c);
    if (!b) return 0;
    uint64_t at;
    memcpy(&at, b, 8);
    if (at == UINT64_MAX) return 0;
    const uint16_t *sz = (const uint16_t *)(b + 8);
    int64_t k_c = c % EBLOCK;
    for (int64_t k = 0; k < k_c; k++) at += sz[k];
    *off = at;
    *nb = sz[k_c];
    return 1;
}

/* Load the index of `shard` (open as `e`; `n_rows_full` rows in a complete version) into
   its slot, once per open: 1 when it is held after. */
static int entry_load(entry_table *et, const int64_t *e, int64_t shard, int64_t n_chunks,
                      int64_t n_rows_full, int64_t hoff, uint64_t max_blob, Py_ssize_t *reads) {
    if (!et || !et->blk || e[TAB_NROWS] != n_rows_full) return 0;
    int64_t *of = et->of + EOF_COLS * shard;
    if (of[EOF_TRIED] == e[TAB_GEN]) return of[EOF_SLOT] >= 0 && of[EOF_GEN] == e[TAB_GEN];
    of[EOF_TRIED] = e[TAB_GEN];
    of[EOF_GEN] = -1;
    if (of[EOF_SLOT] < 0 && et->st[0] >= et->k_n) return 0; /* the budget is taken */
    size_t len = 16 * (size_t)n_chunks + 4;
    uint8_t *ix = malloc(len);
    if (!ix) return 0;
    (*reads)++;
    if (pread_all((int)e[TAB_FD], ix, len, 0) != 0 ||
        crc32c(ix, len - 4) != le32(ix + len - 4)) { /* (a torn or damaged index) */
        free(ix);
        return 0;
    }
    if (of[EOF_SLOT] < 0) of[EOF_SLOT] = et->st[0]++;
    uint8_t *blk = et->blk + (size_t)of[EOF_SLOT] * (size_t)et->n_blocks * EBLOCK_BYTES;
    for (int64_t b = 0; b < et->n_blocks; b++, blk += EBLOCK_BYTES) {
        uint64_t next = 0, base = UINT64_MAX;
        uint16_t *sz = (uint16_t *)(blk + 8);
        int64_t c0 = b * EBLOCK, c1 = c0 + EBLOCK < n_chunks ? c0 + EBLOCK : n_chunks;
        int64_t c = c0;
        for (; c < c1; c++) {
            uint64_t o = le64(ix + 16 * c), s = le64(ix + 16 * c + 8);
            if (!entry_ok(o, s, max_blob, hoff) || s > UINT16_MAX || (c > c0 && o != next))
                break;
            sz[c - c0] = (uint16_t)s;
            next = o + s;
        }
        if (c == c1) base = le64(ix + 16 * c0);
        memcpy(blk, &base, 8);
    }
    free(ix);
    of[EOF_GEN] = e[TAB_GEN];
    return 1;
}

/* Offset and size of chunk `c` of `shard` open as `e` when known without a read (held or
   remembered): 1 when known. */
static int entry_known(const entry_table *et, const int64_t *ec, Py_ssize_t ec_n,
                       const int64_t *e, int64_t shard, int64_t n_chunks, int64_t c,
                       uint64_t *off, uint64_t *nb) {
    if (entry_held(et, e, shard, c, off, nb)) return 1;
    const int64_t *ce = remembered(ec, ec_n, shard, n_chunks, c, e[TAB_GEN]);
    if (!ce) return 0;
    *off = (uint64_t)ce[EC_OFF];
    *nb = (uint64_t)ce[EC_NB];
    return 1;
}

/* Offset and size of chunk `c` of the shard open as `e`: held (`et`: the shard's whole
   index, loaded here the first time a complete version is asked for), remembered, else
   read from its index, with (when `ec`) the other entries of its `span`-entry block
   (ENTRY_RUN: its 4 KiB page), all remembered. 0 when the entry is there and sane; -1 (a
   missing chunk, a bad entry, a failed read: the caller's general path reports it). */
static int chunk_entry(const int64_t *e, int64_t shard, int64_t c, int64_t n_chunks,
                       entry_table *et, int64_t n_rows_full, int64_t *ec, Py_ssize_t ec_n,
                       int64_t span, int64_t hoff, uint64_t max_blob, uint64_t *off,
                       uint64_t *nb, Py_ssize_t *reads) {
    /* (a no-op once tried through this open; entries held or remembered were checked
       with entry_ok when stored) */
    entry_load(et, e, shard, n_chunks, n_rows_full, hoff, max_blob, reads);
    if (entry_known(et, ec, ec_n, e, shard, n_chunks, c, off, nb)) return 0;
    /* remembering: the whole 4 KiB page of entries holding c's (the disk reads the page
       either way; a cold store's later rows of the page then cost one read, not two), or
       for a field of many chunks the ENTRY_WINDOW of them from c rounded down to 16 */
    int64_t c0 = !ec ? c : span == ENTRY_RUN ? c & ~(int64_t)(ENTRY_RUN - 1) : c & ~(int64_t)15;
    int64_t c_last = c;
    if (ec) c_last = c0 + span - 1 < n_chunks ? c0 + span - 1 : n_chunks - 1;
    uint8_t ent[16 * ENTRY_RUN];
    (*reads)++;
    if (pread_all((int)e[TAB_FD], ent, (size_t)(16 * (c_last - c0 + 1)), 16 * c0) != 0)
        return -1;
    for (int64_t k = c0; k <= c_last && ec; k++) {
        uint64_t o = le64(ent + 16 * (k - c0)), s = le64(ent + 16 * (k - c0) + 8);
        if (!entry_ok(o, s, max_blob, hoff)) continue;
        int64_t key = shard * n_chunks + k;
        int64_t *slot = ec + (key % ec_n) * ECACHE_COLS;
        slot[EC_KEY] = key;
        slot[EC_GEN] = e[TAB_GEN];
        slot[EC_OFF] = (int64_t)o;
        slot[EC_NB] = (int64_t)s;
    }
    *off = le64(ent + 16 * (c - c0));
    *nb = le64(ent + 16 * (c - c0) + 8);
    return entry_ok(*off, *nb, max_blob, hoff) ? 0 : -1;
}

/* ---- held chunks -------------------------------------------------------------------- */

/* Columns of `held_tab` (int64, a row per chunk: n_shards x n_chunks rows of HELD_COLS,
   chunk c of shard s at row s * n_chunks + c): where the chunk starts in
   the arena (a position counted from the arena's first byte ever written, -1: none), its
   size (crc32c included), and the version it came from: first step, rows, trusted count.
   `held_state[0]`: bytes written so far. A chunk at position p is intact while
   p >= held_state[0] - arena bytes (chunks never wrap around the arena's end). */
enum { H_POS = 0, H_NB = 1, H_FIRST = 2, H_NROWS = 3, H_TRUSTED = 4, HELD_COLS = 5 };

static int held_holds(const int64_t *a, const int64_t *held_state, int64_t arena_n,
                      int64_t slot, int64_t step) {
    return a[H_POS] >= 0 && a[H_POS] >= held_state[0] - arena_n &&
           a[H_FIRST] + slot == step && slot < a[H_NROWS] && step < a[H_TRUSTED];
}

/* Room for a chunk of `nb` bytes (nb <= arena_n): its position, counted as held_state[0]
   is. Taken before the bytes are written, so no chunk still counted intact is
   overwritten even if the read fails. */
static int64_t held_reserve(int64_t *held_state, int64_t arena_n, int64_t nb) {
    int64_t at = held_state[0];
    if (at % arena_n + nb > arena_n) at += arena_n - at % arena_n;
    held_state[0] = at + nb;
    return at;
}
