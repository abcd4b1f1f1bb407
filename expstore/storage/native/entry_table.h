/* expstore.storage.native._kernels: index entries held per shard (``read_rows``, frames).
 * Included once, by ``shard_reads.h``.
 *
 * A field of one row per chunk (frames) whose chunks outnumber the entry cache (``ecache``,
 * direct-mapped, 32 B per entry) reads a chunk's index entry with a pread of its own before
 * the chunk itself: at 100M small frames half of a batch's reads. This table holds whole
 * shards' indexes compactly instead, 2.125 B per chunk: per block of EBLOCK chunks, the
 * offset of its first chunk (u64); per chunk, its size (u16). A chunk's offset is its
 * block's plus the sizes before it in the block, which holds where a shard's chunks lie one
 * after another in the file (a shard written by ``ShardImage``: frames are appended in
 * order). A block where they do not (a missing chunk, a chunk of 64 KiB or more, a gap) is
 * not held: its chunks take the entry cache's path.
 *
 * A shard's index is loaded with one pread of the whole index and its crc32c checked, the
 * first time a complete version (every row written: it is never rewritten in place) is
 * asked for. Each shard loaded keeps its slot, of `k_n` (the table's memory budget), for
 * its later versions; once they are all taken, other shards are not held (no slot is given
 * up: a ring of whole indexes read again and again would cost more than it saves). An
 * index is used only with the descriptor it was read through (the open's number, as the
 * entry cache does): a shard opened again (a new version) loads again.
 */

#define EBLOCK 64
enum { EOF_SLOT = 0, EOF_GEN = 1, EOF_TRIED = 2, EOF_COLS = 3 };

typedef struct {
    uint16_t *nb;    /* k_n x n_chunks: chunk sizes (crc32c included) */
    uint64_t *base;  /* k_n x n_blocks: offset of the block's first chunk; UINT64_MAX: none */
    int64_t *of;     /* n_shards x EOF_COLS: the shard's slot (-1: none), the open its
                        slot's index was loaded through, the open last tried (-1: none) */
    int64_t *st;     /* slots taken */
    int64_t k_n, n_blocks;
} entry_table;

/* Offset and size of chunk `c` of `shard` open as `e`, from its held index: 1 when held. */
static int entry_held(const entry_table *et, const int64_t *e, int64_t shard, int64_t c,
                      int64_t n_chunks, uint64_t *off, uint64_t *nb) {
    if (!et || !et->nb) return 0;
    const int64_t *of = et->of + EOF_COLS * shard;
    if (of[EOF_SLOT] < 0 || of[EOF_GEN] != e[TAB_GEN]) return 0;
    const uint16_t *sz = et->nb + of[EOF_SLOT] * n_chunks;
    uint64_t at = et->base[of[EOF_SLOT] * et->n_blocks + c / EBLOCK];
    if (at == UINT64_MAX) return 0;
    for (int64_t k = c & ~(int64_t)(EBLOCK - 1); k < c; k++) at += sz[k];
    *off = at;
    *nb = sz[c];
    return 1;
}

/* Load the index of `shard` (open as `e`; `n_rows_full` rows in a complete version) into
   its slot, once per open: 1 when it is held after. */
static int entry_load(entry_table *et, const int64_t *e, int64_t shard, int64_t n_chunks,
                      int64_t n_rows_full, int64_t hoff, uint64_t max_blob, Py_ssize_t *reads) {
    if (!et || !et->nb || e[TAB_NROWS] != n_rows_full) return 0;
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
    int64_t k = of[EOF_SLOT];
    uint16_t *sz = et->nb + k * n_chunks;
    uint64_t *base = et->base + k * et->n_blocks;
    for (int64_t b = 0; b < et->n_blocks; b++) {
        uint64_t next = 0;
        base[b] = UINT64_MAX;
        int64_t c0 = b * EBLOCK, c1 = c0 + EBLOCK < n_chunks ? c0 + EBLOCK : n_chunks;
        int64_t c = c0;
        for (; c < c1; c++) {
            uint64_t o = le64(ix + 16 * c), s = le64(ix + 16 * c + 8);
            if (!entry_ok(o, s, max_blob, hoff) || s > UINT16_MAX || (c > c0 && o != next))
                break;
            sz[c] = (uint16_t)s;
            next = o + s;
        }
        if (c == c1) base[b] = le64(ix + 16 * c0);
    }
    free(ix);
    of[EOF_GEN] = e[TAB_GEN];
    return 1;
}
