/*
 * Batch decoding of inner chunks: many rows per call, no Python per row.
 *
 * The hot read path decodes thousands of small blosc frames (one 84x84 frame each) per
 * second. Through numcodecs, each costs a Python call, argument checks and a separate
 * crc32c call: ~10 us of overhead for ~2 us of work. These functions take whole batches
 * and run without the GIL (the read side only: the writer's batch kernels are in
 * ``_write.c``, part of the ``_step`` extension):
 *
 *   decode_pread(fds, starts, sizes, dst, out, row_bytes, checksum)
 *       pread() each chunk [start, start+size) of file descriptor fd, check its trailing
 *       crc32c when `checksum`, decode it into row dst[i] of `out`.
 *   decode_blobs(blobs, dst, out, row_bytes, checksum)
 *       the same for chunks already in memory (remote stores).
 *
 *   read_rows(state, shards, slots, steps, dst, out, ok[, chunks, chunk_dst])
 *       a batch of rows straight from the shard files, opening shards as needed; `state`
 *       (a ReadState, built once per field of a reader) holds what does not change per
 *       batch (``shard_reads.h``; the method table says more).
 *
 *   first_index / table_rows / place_rows: a batch's lookups around the reads
 *       (``batch_lookup.h``); gather_held: a batch's small fields from the hot set
 *       (``hot_gather.h``).
 *
 *   copy_rows(src, src_rows, dst, dst_rows, row_bytes)
 *       gather/scatter whole rows (frame stacks into a batch) with one memcpy each:
 *       numpy's take moves 84x84 rows at ~2.5 GB/s here, memcpy at ~7.
 *
 * The decoders return (status, index): status 0 when every chunk decoded, else the kind of the
 * first failure and its position. The caller then falls back to the general path, which
 * reports the failure with the object's name. Supported: blosc1 frames (the format zarr's
 * blosc codec writes) holding LZ4 or LZ4HC data, or stored raw (memcpyed), with no or
 * byte shuffle. Anything else answers STATUS_UNSUPPORTED, never a wrong decode. Every
 * length and offset read from the data is bounds-checked: corrupt input cannot make the
 * decoder read or write outside its buffers.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "buffers.h" /* held_buffer, take, release */
#include "crc32c.h"  /* crc_init, crc32c */

enum {
    STATUS_OK = 0,
    STATUS_READ = 1,        /* pread failed or came back short */
    STATUS_CHECKSUM = 2,    /* crc32c mismatch */
    STATUS_CORRUPT = 3,     /* frame does not decode to row_bytes bytes */
    STATUS_UNSUPPORTED = 4, /* a codec this kernel does not decode (fall back) */
    STATUS_BOUNDS = 5,      /* dst row outside `out` */
};

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

#include "lz4_block.h" /* lz4_prefix: one LZ4 block, whole or a prefix */

/* ---- blosc1 frame --------------------------------------------------------------- */

#define BLOSC_DOSHUFFLE 0x1
#define BLOSC_MEMCPYED 0x2
#define BLOSC_DOBITSHUFFLE 0x4
#define BLOSC_DONTSPLIT 0x10
#define BLOSC_LZ4_FORMAT 1
#define BLOSC_HEADER 16

typedef struct {
    uint8_t *buf;
    size_t cap;
} scratch_t;

static int scratch_reserve(scratch_t *s, size_t n) {
    if (n <= s->cap) return 0;
    uint8_t *b = realloc(s->buf, n);
    if (b == NULL) return -1;
    s->buf = b;
    s->cap = n;
    return 0;
}

static void unshuffle(size_t typesize, size_t n, const uint8_t *src, uint8_t *dst) {
    size_t neles = n / typesize;
    for (size_t b = 0; b < typesize; b++)
        for (size_t i = 0; i < neles; i++) dst[i * typesize + b] = src[b * neles + i];
    size_t rem = n % typesize;
    memcpy(dst + n - rem, src + n - rem, rem);
}

/* LZ4-decode block `j` of a blosc1 frame (its `nsplits` streams, still byte-shuffled if the
   frame is) into `out`: `bsize` bytes, or (upto < bsize) at least what bytes [0, upto)
   of the unshuffled block need: a prefix of each stream where that is all they need (a
   single unshuffled stream, or one stream per byte plane). A STATUS_* code. */
static int blosc_block(const uint8_t *src, size_t n, unsigned flags, size_t typesize,
                       size_t blocksize, size_t j, size_t bsize, int last, uint8_t *out,
                       size_t upto) {
    const uint8_t *end = src + n;
    size_t start = le32(src + BLOSC_HEADER + 4 * j);
    if (start >= n) return STATUS_CORRUPT;
    const uint8_t *p = src + start;
    size_t nsplits = 1;
    if (!(flags & BLOSC_DONTSPLIT) && typesize <= 16 && blocksize / typesize >= 128 && !last)
        nsplits = typesize;
    size_t neblock = bsize / nsplits, want = neblock;
    int shuffled = (flags & BLOSC_DOSHUFFLE) && typesize > 1;
    if (upto > 0 && upto < bsize) {
        if (nsplits == 1 && !shuffled) want = upto;
        else if (nsplits == typesize && shuffled) want = (upto - 1) / typesize + 1;
    }
    for (size_t k = 0; k < nsplits; k++) {
        if (end - p < 4) return STATUS_CORRUPT;
        size_t cb = le32(p);
        p += 4;
        if (cb > (size_t)(end - p)) return STATUS_CORRUPT;
        if (cb == neblock) {
            memcpy(out, p, want);
        } else if (lz4_prefix(p, cb, out, neblock, want) != 0) {
            return STATUS_CORRUPT;
        }
        p += cb;
        out += neblock;
    }
    return STATUS_OK;
}

/* Decode one blosc1 frame into exactly `dstlen` bytes: a STATUS_* code. */
static int blosc_frame(const uint8_t *src, size_t n, uint8_t *dst, size_t dstlen,
                       scratch_t *tmp) {
    if (n < BLOSC_HEADER) return STATUS_CORRUPT;
    unsigned flags = src[2];
    size_t typesize = src[3] ? src[3] : 1;
    size_t nbytes = le32(src + 4), blocksize = le32(src + 8), cbytes = le32(src + 12);
    if (nbytes != dstlen || cbytes > n) return STATUS_CORRUPT;
    if (flags & BLOSC_MEMCPYED) {
        if (BLOSC_HEADER + nbytes > n) return STATUS_CORRUPT;
        memcpy(dst, src + BLOSC_HEADER, nbytes);
        return STATUS_OK;
    }
    if (flags & BLOSC_DOBITSHUFFLE) return STATUS_UNSUPPORTED;
    if (((flags & 0xe0) >> 5) != BLOSC_LZ4_FORMAT) return STATUS_UNSUPPORTED;
    if (nbytes == 0) return STATUS_OK;
    if (blocksize == 0 || blocksize > nbytes) return STATUS_CORRUPT;
    int shuffle = (flags & BLOSC_DOSHUFFLE) && typesize > 1;
    if (shuffle && scratch_reserve(tmp, blocksize) != 0) return STATUS_CORRUPT;
    size_t nblocks = nbytes / blocksize, leftover = nbytes % blocksize;
    if (leftover) nblocks++;
    if (BLOSC_HEADER + 4 * nblocks > n) return STATUS_CORRUPT;
    for (size_t j = 0; j < nblocks; j++) {
        int last = leftover && j == nblocks - 1;
        size_t bsize = last ? leftover : blocksize;
        uint8_t *out = shuffle ? tmp->buf : dst + j * blocksize;
        int st = blosc_block(src, n, flags, typesize, blocksize, j, bsize, last, out, bsize);
        if (st != STATUS_OK) return st;
        if (shuffle) unshuffle(typesize, bsize, tmp->buf, dst + j * blocksize);
    }
    return STATUS_OK;
}

/* Bytes [lo, hi) of one blosc1 frame of `dstlen` decoded bytes into `out`, decoding only
   the blocks that hold them and, for byte-shuffled blocks, gathering the wanted bytes from
   the shuffled planes instead of unshuffling whole blocks (one scalar of a 4096-row chunk
   costs one block's LZ4 decode, not the whole chunk's decode and unshuffle). */
static int blosc_range(const uint8_t *src, size_t n, size_t dstlen, size_t lo, size_t hi,
                       uint8_t *out, scratch_t *tmp) {
    if (n < BLOSC_HEADER) return STATUS_CORRUPT;
    unsigned flags = src[2];
    size_t typesize = src[3] ? src[3] : 1;
    size_t nbytes = le32(src + 4), blocksize = le32(src + 8), cbytes = le32(src + 12);
    if (nbytes != dstlen || cbytes > n || lo > hi || hi > nbytes) return STATUS_CORRUPT;
    if (flags & BLOSC_MEMCPYED) {
        if (BLOSC_HEADER + nbytes > n) return STATUS_CORRUPT;
        memcpy(out, src + BLOSC_HEADER + lo, hi - lo);
        return STATUS_OK;
    }
    if (flags & BLOSC_DOBITSHUFFLE) return STATUS_UNSUPPORTED;
    if (((flags & 0xe0) >> 5) != BLOSC_LZ4_FORMAT) return STATUS_UNSUPPORTED;
    if (hi == lo) return STATUS_OK;
    if (blocksize == 0 || blocksize > nbytes) return STATUS_CORRUPT;
    int shuffle = (flags & BLOSC_DOSHUFFLE) && typesize > 1;
    if (scratch_reserve(tmp, blocksize) != 0) return STATUS_CORRUPT;
    size_t nblocks = nbytes / blocksize, leftover = nbytes % blocksize;
    if (leftover) nblocks++;
    if (BLOSC_HEADER + 4 * nblocks > n) return STATUS_CORRUPT;
    for (size_t j = lo / blocksize; j < nblocks && j * blocksize < hi; j++) {
        int last = leftover && j == nblocks - 1;
        size_t bsize = last ? leftover : blocksize;
        size_t a = lo > j * blocksize ? lo - j * blocksize : 0;      /* in this block */
        size_t z = hi - j * blocksize < bsize ? hi - j * blocksize : bsize;
        int st = blosc_block(src, n, flags, typesize, blocksize, j, bsize, last, tmp->buf, z);
        if (st != STATUS_OK) return st;
        uint8_t *o = out + (j * blocksize + a - lo);
        if (!shuffle) {
            memcpy(o, tmp->buf + a, z - a);
            continue;
        }
        size_t neles = bsize / typesize, whole = neles * typesize;
        for (size_t q = a; q < z; q++) /* byte q of the block: element q / typesize */
            o[q - a] = q < whole ? tmp->buf[(q % typesize) * neles + q / typesize]
                                 : tmp->buf[q];
    }
    return STATUS_OK;
}

/* Check the trailing crc32c (when asked), then bytes [lo, hi) of the decoded chunk. */
static int decode_range(const uint8_t *blob, size_t n, int checksum, size_t chunk_bytes,
                        size_t lo, size_t hi, uint8_t *out, scratch_t *tmp) {
    if (checksum) {
        if (n < 4) return STATUS_CHECKSUM;
        n -= 4;
        if (crc32c(blob, n) != le32(blob + n)) return STATUS_CHECKSUM;
    }
    return blosc_range(blob, n, chunk_bytes, lo, hi, out, tmp);
}

/* Check the trailing crc32c (when asked) and decode one chunk. */
static int decode_chunk(const uint8_t *blob, size_t n, int checksum, uint8_t *dst,
                        size_t row_bytes, scratch_t *tmp) {
    if (checksum) {
        if (n < 4) return STATUS_CHECKSUM;
        n -= 4;
        if (crc32c(blob, n) != le32(blob + n)) return STATUS_CHECKSUM;
    }
    return blosc_frame(blob, n, dst, row_bytes, tmp);
}

/* ---- Python face ---------------------------------------------------------------- */

static PyObject *decode_pread(PyObject *self, PyObject *args) {
    PyObject *fds_o, *starts_o, *sizes_o, *dst_o, *out_o;
    Py_ssize_t row_bytes;
    int checksum;
    if (!PyArg_ParseTuple(args, "OOOOOnp", &fds_o, &starts_o, &sizes_o, &dst_o, &out_o,
                          &row_bytes, &checksum))
        return NULL;
    held_buffer fds = {0}, starts = {0}, sizes = {0}, dst = {0}, out = {0};
    PyObject *result = NULL;
    if (take(fds_o, &fds, 4, 0, "fds (int32)") || take(starts_o, &starts, 8, 0, "starts") ||
        take(sizes_o, &sizes, 8, 0, "sizes") || take(dst_o, &dst, 8, 0, "dst") ||
        take(out_o, &out, 0, 1, "out"))
        goto done;
    Py_ssize_t n = fds.view.len / 4;
    if (starts.view.len / 8 != n || sizes.view.len / 8 != n || dst.view.len / 8 != n ||
        row_bytes <= 0) {
        PyErr_SetString(PyExc_ValueError, "fds, starts, sizes and dst must have one entry "
                                          "per chunk; row_bytes must be positive");
        goto done;
    }
    const int32_t *fd = fds.view.buf;
    const int64_t *st = starts.view.buf, *sz = sizes.view.buf, *dr = dst.view.buf;
    uint8_t *o = out.view.buf;
    Py_ssize_t out_rows = out.view.len / row_bytes;
    int status = STATUS_OK;
    Py_ssize_t i = 0;
    long long total = 0;
    scratch_t blob = {0}, tmp = {0};
    Py_BEGIN_ALLOW_THREADS
    for (; i < n; i++) {
        if (dr[i] < 0 || dr[i] >= out_rows) { status = STATUS_BOUNDS; break; }
        if (sz[i] < 0 || scratch_reserve(&blob, (size_t)sz[i]) != 0) {
            status = STATUS_READ;
            break;
        }
        size_t got = 0, want = (size_t)sz[i];
        while (got < want) {
            ssize_t r = pread(fd[i], blob.buf + got, want - got, (off_t)(st[i] + got));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) break;
            got += (size_t)r;
        }
        if (got != want) { status = STATUS_READ; break; }
        total += (long long)want;
        status = decode_chunk(blob.buf, want, checksum, o + dr[i] * row_bytes,
                              (size_t)row_bytes, &tmp);
        if (status != STATUS_OK) break;
    }
    Py_END_ALLOW_THREADS
    free(blob.buf);
    free(tmp.buf);
    result = Py_BuildValue("(inL)", status, status == STATUS_OK ? (Py_ssize_t)-1 : i, total);
done:
    release(&fds);
    release(&starts);
    release(&sizes);
    release(&dst);
    release(&out);
    return result;
}

/* ---- rows by shard, opening shards as needed -------------------------------------- */

#include "shard_reads.h" /* open_shard, holds, sort_rows, chunk_entry, held chunks */

/* Decode row `i`'s chunk from `blob` into its place; the STATUS_* of the decode. */
static int decode_into(const uint8_t *blob, size_t nb, int checksum, size_t chunk_rows,
                       size_t chunk_bytes, size_t lo, size_t row_bytes, uint8_t *row_dst,
                       scratch_t *tmp) {
    if (chunk_rows == 1) return decode_chunk(blob, nb, checksum, row_dst, row_bytes, tmp);
    return decode_range(blob, nb, checksum, chunk_bytes, lo, lo + row_bytes, row_dst, tmp);
}

#include "read_pool.h" /* the read pool; read_rows' runs deferred and read concurrently */

/* ---- a reader's state: what read_rows keeps between calls ------------------------------ */

/* ReadState(prefix, suffix, n_chunks, chunk_rows, shards_per_lane, row_bytes, checksum,
             known, tab, ring, state, ecache[, arena, held_tab, held_state])
   Built once per field of a reader (``FdTable``): the shard files' path parts, the chunk
   geometry, and the arrays read_rows reads and updates in place (held here, checked
   once): the reader's committed counts per lane, the descriptors per shard and their
   ring, the index entries remembered, and (chunks of more than one row) the arena of
   compressed chunks held with its table and counter (``shard_reads.h``). */
typedef struct {
    PyObject_HEAD
    PyObject *prefix, *suffix; /* bytes */
    Py_ssize_t n_chunks, chunk_rows, spl, row_bytes;
    int checksum, hold;
    held_buffer known, tab, ring, state, ecache, arena, held_tab, held_state;
    held_buffer eblk, eof, estate; /* whole shards' index entries (shard_reads.h) */
} ReadState;

static void ReadState_release(ReadState *r) {
    release(&r->known), release(&r->tab), release(&r->ring), release(&r->state);
    release(&r->ecache), release(&r->arena), release(&r->held_tab), release(&r->held_state);
    release(&r->eblk), release(&r->eof), release(&r->estate);
    Py_CLEAR(r->prefix);
    Py_CLEAR(r->suffix);
    r->hold = 0;
}

/* Drop every mapping of the table (its descriptors stay as they are: FdTable owns them). */
static void ReadState_unmap(ReadState *r) {
    if (!r->tab.held || r->state.view.len / 8 != STATE_LEN) return;
    int64_t *tab = r->tab.view.buf, *state = r->state.view.buf;
    for (Py_ssize_t k = 0; k < r->tab.view.len / (8 * TAB_COLS); k++)
        shard_unmap(tab + k * TAB_COLS, state);
}

static void ReadState_dealloc(ReadState *r) {
    ReadState_unmap(r);
    ReadState_release(r);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static int ReadState_init(ReadState *r, PyObject *args, PyObject *kw) {
    PyObject *prefix, *suffix, *known_o, *tab_o, *ring_o, *state_o, *ec_o;
    PyObject *arena_o = Py_None, *htab_o = Py_None, *hstate_o = Py_None;
    PyObject *eblk_o = Py_None, *eof_o = Py_None, *estate_o = Py_None;
    ReadState_unmap(r);
    ReadState_release(r);
    if (!PyArg_ParseTuple(args, "O!O!nnnnpOOOOO|OOOOOO", &PyBytes_Type, &prefix,
                          &PyBytes_Type, &suffix, &r->n_chunks, &r->chunk_rows, &r->spl,
                          &r->row_bytes, &r->checksum, &known_o, &tab_o, &ring_o, &state_o,
                          &ec_o, &arena_o, &htab_o, &hstate_o, &eblk_o, &eof_o, &estate_o))
        return -1;
    Py_INCREF(prefix);
    r->prefix = prefix;
    Py_INCREF(suffix);
    r->suffix = suffix;
    if (take(known_o, &r->known, 8, 0, "known") || take(tab_o, &r->tab, 8 * TAB_COLS, 1, "tab") ||
        take(ring_o, &r->ring, 8, 1, "ring") || take(state_o, &r->state, 8, 1, "state") ||
        take(ec_o, &r->ecache, 8 * ECACHE_COLS, 1, "ecache"))
        return -1;
    if (r->row_bytes <= 0 || r->chunk_rows <= 0 || r->n_chunks <= 0 || r->spl <= 0 ||
        r->ring.view.len <= 0 || r->known.view.len <= 0 ||
        r->state.view.len / 8 != STATE_LEN) {
        PyErr_Format(PyExc_ValueError, "ReadState: sizes positive, state of %d", STATE_LEN);
        return -1;
    }
    if (eblk_o != Py_None) {
        Py_ssize_t blocks = (r->n_chunks + EBLOCK - 1) / EBLOCK;
        if (take(eblk_o, &r->eblk, EBLOCK_BYTES * blocks, 1, "entry_blocks") ||
            take(eof_o, &r->eof, 8 * EOF_COLS, 1, "entry_of") ||
            take(estate_o, &r->estate, 8, 1, "entry_state"))
            return -1;
        if (r->chunk_rows != 1 || (uintptr_t)r->eblk.view.buf % EBLOCK_BYTES != 0 ||
            r->eof.view.len / (8 * EOF_COLS) != r->tab.view.len / (8 * TAB_COLS)) {
            PyErr_Format(PyExc_ValueError, "ReadState: held entries need one row per chunk, "
                                           "entry_blocks %d-byte aligned and an entry_of row "
                                           "per shard", EBLOCK_BYTES);
            return -1;
        }
    }
    r->hold = arena_o != Py_None;
    if (r->hold && (take(arena_o, &r->arena, 0, 1, "arena") ||
                    take(htab_o, &r->held_tab, 8 * HELD_COLS, 1, "held_tab") ||
                    take(hstate_o, &r->held_state, 8, 1, "held_state")))
        return -1;
    if (r->hold && (r->chunk_rows == 1 || r->arena.view.len <= 0 || r->held_state.view.len < 8 ||
                    r->held_tab.view.len / (8 * HELD_COLS) !=
                        r->tab.view.len / (8 * TAB_COLS) * r->n_chunks)) {
        PyErr_SetString(PyExc_ValueError, "ReadState: held chunks need chunks of more than "
                                          "one row, a non-empty arena and a held_tab row "
                                          "per chunk");
        return -1;
    }
    return 0;
}

static PyTypeObject ReadStateType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "expstore.storage.native._kernels.ReadState",
    .tp_basicsize = sizeof(ReadState),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "What read_rows keeps for one field of a reader between calls (see read_rows).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ReadState_init,
    .tp_dealloc = (destructor)ReadState_dealloc,
};

/* read_rows: see the method table. */
static PyObject *read_rows(PyObject *self, PyObject *args) {
    ReadState *rs;
    PyObject *shards_o, *slots_o, *steps_o, *dst_o, *out_o, *ok_o;
    PyObject *chunks_o = Py_None, *cdst_o = Py_None;
    if (!PyArg_ParseTuple(args, "O!OOOOOO|OO", &ReadStateType, &rs, &shards_o, &slots_o,
                          &steps_o, &dst_o, &out_o, &ok_o, &chunks_o, &cdst_o))
        return NULL;
    if (rs->prefix == NULL) {
        PyErr_SetString(PyExc_ValueError, "read_rows: the ReadState was not set up");
        return NULL;
    }
    const char *prefix = PyBytes_AS_STRING(rs->prefix), *suffix = PyBytes_AS_STRING(rs->suffix);
    const Py_ssize_t n_chunks = rs->n_chunks, chunk_rows = rs->chunk_rows, spl = rs->spl;
    const Py_ssize_t row_bytes = rs->row_bytes;
    const int checksum = rs->checksum;
    held_buffer sh = {0}, sl = {0}, sp = {0}, ds = {0}, out = {0}, okb = {0}, ch = {0},
                cd = {0};
    PyObject *result = NULL;
    read_order *ord = NULL;
    if (take(shards_o, &sh, 8, 0, "shards") || take(slots_o, &sl, 8, 0, "slots") ||
        take(steps_o, &sp, 8, 0, "steps") || take(dst_o, &ds, 8, 0, "dst") ||
        take(out_o, &out, 0, 1, "out") || take(ok_o, &okb, 1, 1, "ok"))
        goto done;
    int64_t *ec = rs->ecache.view.buf;
    Py_ssize_t ec_n = rs->ecache.view.len / (8 * ECACHE_COLS);
    if (ec_n == 0) ec = NULL;
    entry_table et = {0}, *etp = NULL;
    if (rs->eblk.held && rs->eblk.view.len > 0 && rs->estate.view.len >= 8) {
        et.blk = rs->eblk.view.buf;
        et.of = rs->eof.view.buf;
        et.st = rs->estate.view.buf;
        et.n_blocks = (n_chunks + EBLOCK - 1) / EBLOCK;
        et.k_n = rs->eblk.view.len / (EBLOCK_BYTES * et.n_blocks);
        if (et.st[0] < 0 || et.st[0] > et.k_n) et.st[0] = et.k_n; /* (never: no more slots) */
        etp = &et;
    }
    int keep_chunks = chunks_o != Py_None;
    if (keep_chunks && (take(chunks_o, &ch, 0, 1, "chunks") ||
                        take(cdst_o, &cd, 8, 0, "chunk_dst")))
        goto done;
    int hold = rs->hold && !keep_chunks; /* (chunks kept by the caller: not held here) */
    Py_ssize_t n = sh.view.len / 8, n_shards = rs->tab.view.len / (8 * TAB_COLS);
    const int64_t span = entry_span((int64_t)n_shards * n_chunks, ec_n);
    Py_ssize_t ring_n = rs->ring.view.len / 8, lanes = rs->known.view.len / 8;
    if (sl.view.len / 8 != n || sp.view.len / 8 != n || ds.view.len / 8 != n ||
        okb.view.len != n) {
        PyErr_SetString(PyExc_ValueError, "read_rows: shards, slots, steps, dst and ok need "
                                          "one entry per row");
        goto done;
    }
    int64_t *tab = rs->tab.view.buf, *ring = rs->ring.view.buf, *state = rs->state.view.buf;
    const int64_t *shards = sh.view.buf, *slots = sl.view.buf, *steps = sp.view.buf;
    const int64_t *dst = ds.view.buf, *known = rs->known.view.buf;
    uint8_t *o = out.view.buf, *ok = okb.view.buf;
    uint8_t *arena = hold ? rs->arena.view.buf : NULL;
    int64_t *htab = hold ? rs->held_tab.view.buf : NULL;
    int64_t *hstate = hold ? rs->held_state.view.buf : NULL;
    const int64_t arena_n = hold ? (int64_t)rs->arena.view.len : 0;
    Py_ssize_t out_rows = out.view.len / row_bytes;
    const size_t chunk_bytes = (size_t)chunk_rows * (size_t)row_bytes;
    const int64_t *cdst = keep_chunks ? cd.view.buf : NULL;
    uint8_t *chunks = keep_chunks ? ch.view.buf : NULL;
    if (keep_chunks && (cd.view.len / 8 != n || chunk_rows == 1)) {
        PyErr_SetString(PyExc_ValueError, "read_rows: chunk_dst needs one entry per row, "
                                          "and chunks of more than one row");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (cdst && cdst[i] >= 0 &&
            (cdst[i] > ch.view.len || (size_t)(ch.view.len - cdst[i]) < chunk_bytes)) {
            PyErr_Format(PyExc_IndexError, "read_rows: chunk_dst of row %zd out of range", i);
            goto done;
        }
        if (shards[i] < 0 || shards[i] >= n_shards || shards[i] / spl >= lanes ||
            slots[i] < 0 || slots[i] >= n_chunks * chunk_rows || dst[i] < 0 ||
            dst[i] >= out_rows) {
            PyErr_Format(PyExc_IndexError, "read_rows: row %zd out of range", i);
            goto done;
        }
    }
    /* per row in read order: its place, then (rows of a run) its chunk's offset and size,
       found once while the run is built */
    ord = PyMem_RawMalloc((size_t)(n ? n : 1) * (sizeof *ord + 2 * sizeof(uint64_t)));
    if (!ord) {
        PyErr_NoMemory();
        goto done;
    }
    uint64_t *run_off = (uint64_t *)(ord + (n ? n : 1)), *run_nb = run_off + (n ? n : 1);
    const int64_t hoff = 16 * (int64_t)n_chunks + 4;
    /* a blosc frame is at most its data + header + block offsets + split sizes + crc */
    const uint64_t max_blob = 2 * (uint64_t)chunk_bytes + 4096;
    /* chunks read with one pread at most: those lying one after another in the file */
    const uint64_t max_run = max_blob > (1u << 20) ? max_blob : (1u << 20);
    /* and with at most this many bytes not asked for between two of them (a stack whose
       middle frame is cached: one read, not two) */
#define RUN_GAP 4096u
    int status = STATUS_OK;
    Py_ssize_t opened = 0, reads = 0;
    long long total = 0;
    scratch_t blob = {0}, tmp = {0};
    int64_t last_shard = -1;
    uint64_t last_off = 0, last_nb = 0;
    const uint8_t *last_rows = NULL; /* where the last multi-row chunk was decoded */
    /* a multi-row chunk left checked in `blob` (its shard version's open generation,
       offset, bytes), so the next rows of it in this batch decode without a read */
    int64_t blob_gen = -1;
    uint64_t blob_off = 0, blob_nb = 0;
    /* frames (one row per chunk, none kept): runs read concurrently (read_pool.h) */
    const int depth = read_depth;
    pending_runs pend;
    Py_BEGIN_ALLOW_THREADS
    const int defer = depth > 1 && chunk_rows == 1 && !hold && !cdst;
    if (defer) pend_init(&pend, run_off, run_nb);
#define FLUSH_RUNS() if (defer) pend_flush(&pend, depth, ord, dst, o, row_bytes, checksum, ok, \
                                           &status, &total, &tmp, state)
    memset(ok, 0, (size_t)n);
    sort_rows(ord, shards, slots, n, n_chunks * chunk_rows);
    /* the held entry blocks of every row asked for at once: their misses in RAM overlap,
       where the runs' lookups below would each wait on their own (a loop here, not a
       function: GCC finds a function that only prefetches pure, and drops its call) */
    for (Py_ssize_t p = 0; etp && chunk_rows == 1 && p < n; p++) {
        int64_t shard = shards[ord[p].i];
        const uint8_t *b = entry_block(etp, tab + shard * TAB_COLS, shard, slots[ord[p].i]);
        if (b) __builtin_prefetch(b);
    }
    for (Py_ssize_t p = 0; status == STATUS_OK && p < n; p++) {
        Py_ssize_t i = ord[p].i;
        int64_t shard = shards[i], slot = slots[i], step = steps[i];
        int64_t *e = tab + shard * TAB_COLS;
        uint8_t *row_dst = o + dst[i] * row_bytes;
        size_t lo = (size_t)(slot % chunk_rows) * (size_t)row_bytes;
        int64_t *a = hold ? htab + (shard * n_chunks + slot / chunk_rows) * HELD_COLS : NULL;
        int st;
        if (a && held_holds(a, hstate, arena_n, slot, step)) { /* compressed chunk in RAM */
            st = decode_range(arena + a[H_POS] % arena_n, (size_t)a[H_NB] - (checksum ? 4 : 0),
                              0, chunk_bytes, lo, lo + (size_t)row_bytes, row_dst, &tmp);
            if (st == STATUS_UNSUPPORTED) status = st;
            ok[i] = st == STATUS_OK;
            continue;
        }
        if (!holds(e, slot, step)) { /* not open, or a version that lacks the step */
            FLUSH_RUNS(); /* (an open may close a descriptor a recorded run reads through) */
            if (open_shard(prefix, suffix, shard, hoff, known[shard / spl], tab, ring, ring_n,
                           state) != 0)
                continue;
            opened++;
            if (shard == last_shard) last_shard = -1;
            if (!holds(e, slot, step)) continue; /* overwritten: the caller reports it */
        }
        int fd = (int)e[TAB_FD];
        int64_t c = slot / chunk_rows;
        uint64_t off, nb;
        if (chunk_entry(e, shard, c, n_chunks, etp, n_chunks * chunk_rows, ec, ec_n, span,
                        hoff, max_blob, &off, &nb, &reads) != 0)
            continue;
        if (chunk_rows > 1 && shard == last_shard && off == last_off && nb == last_nb) {
            memcpy(row_dst, last_rows + lo, (size_t)row_bytes);
            ok[i] = 1;
            continue;
        }
        if (chunk_rows > 1 && blob_gen == e[TAB_GEN] && off == blob_off && nb == blob_nb &&
            !(cdst && cdst[i] >= 0)) { /* the chunk just read and checked: no read again */
            st = decode_range(blob.buf, (size_t)nb - (checksum ? 4 : 0), 0, chunk_bytes, lo,
                              lo + (size_t)row_bytes, row_dst, &tmp);
            if (st == STATUS_UNSUPPORTED) status = st;
            ok[i] = st == STATUS_OK;
            continue;
        }
        if (a && nb <= (uint64_t)arena_n) { /* keep the compressed chunk */
            a[H_POS] = -1;
            int64_t at = held_reserve(hstate, arena_n, (int64_t)nb);
            uint8_t *kept = arena + at % arena_n;
            reads++;
            if (pread_all(fd, kept, (size_t)nb, (int64_t)off) != 0) continue;
            total += (long long)nb;
            st = decode_range(kept, (size_t)nb, checksum, chunk_bytes, lo,
                              lo + (size_t)row_bytes, row_dst, &tmp);
            if (st == STATUS_OK) {
                a[H_POS] = at;
                a[H_NB] = (int64_t)nb;
                a[H_FIRST] = e[TAB_FIRST];
                a[H_NROWS] = e[TAB_NROWS];
                a[H_TRUSTED] = e[TAB_TRUSTED];
            }
            if (st == STATUS_UNSUPPORTED) status = st;
            ok[i] = st == STATUS_OK;
            continue;
        }
        /* the rows after this one whose chunks follow it in the file: one read for all */
        Py_ssize_t q = p;
        uint64_t end = off + nb, prev = off;
        run_off[p] = off;
        run_nb[p] = nb;
        while (chunk_rows == 1 && q + 1 < n) {
            Py_ssize_t j = ord[q + 1].i;
            uint64_t oj, nj;
            if (shards[j] != shard || !holds(e, slots[j], steps[j]) ||
                !entry_known(etp, ec, ec_n, e, shard, n_chunks, slots[j], &oj, &nj))
                break;
            if (oj == prev && oj + nj == end) { /* the same chunk again */
                q++;
                run_off[q] = oj;
                run_nb[q] = nj;
                continue;
            }
            /* a gap of chunks not asked for (frames the caller's cache holds) is read too */
            if (oj < end || oj - end > RUN_GAP || oj + nj - off > max_run) break;
            prev = oj;
            end = oj + nj;
            q++;
            run_off[q] = oj;
            run_nb[q] = nj;
        }
        if (defer) {
            if (pend_add(&pend, fd, shard_mapped(e, state, end), off, (size_t)(end - off), p,
                         q) == 0)
                reads++;
            if (pend.used >= PEND_BYTES) FLUSH_RUNS();
            p = q;
            continue;
        }
        blob_gen = -1; /* (blob is read over) */
        if (scratch_reserve(&blob, (size_t)(end - off)) != 0) continue;
        reads++;
        const uint8_t *map = chunk_rows == 1 ? shard_mapped(e, state, end) : NULL;
        if (map && map_copy(blob.buf, map + off, (size_t)(end - off)) == 0) {
            state[ST_MAP_READS]++;
        } else if (pread_all(fd, blob.buf, (size_t)(end - off), (int64_t)off) != 0) {
            continue;
        }
        total += (long long)(end - off);
        for (Py_ssize_t k = p; k <= q && status == STATUS_OK; k++) {
            Py_ssize_t j = ord[k].i;
            uint64_t oj = run_off[k], nj = run_nb[k];
            uint8_t *dst_j = o + dst[j] * row_bytes;
            if (cdst && cdst[j] >= 0) { /* keep the whole multi-row chunk for the caller */
                last_shard = -1;
                uint8_t *rows_at = chunks + cdst[j];
                st = decode_chunk(blob.buf, (size_t)nj, checksum, rows_at, chunk_bytes, &tmp);
                if (st == STATUS_OK) {
                    memcpy(dst_j, rows_at + lo, (size_t)row_bytes);
                    last_rows = rows_at;
                    last_shard = shard;
                    last_off = off;
                    last_nb = nb;
                }
            } else {
                st = decode_into(blob.buf + (oj - off), (size_t)nj, checksum, (size_t)chunk_rows,
                                 chunk_bytes, lo, (size_t)row_bytes, dst_j, &tmp);
                if (chunk_rows > 1 && st == STATUS_OK) { /* checked: later rows reuse it */
                    blob_gen = e[TAB_GEN];
                    blob_off = off;
                    blob_nb = nb;
                }
            }
            if (st == STATUS_UNSUPPORTED) status = st;
            ok[j] = st == STATUS_OK;
        }
        p = q;
    }
    FLUSH_RUNS();
#undef FLUSH_RUNS
    if (defer) pend_free(&pend);
    Py_END_ALLOW_THREADS
    free(blob.buf);
    free(tmp.buf);
    if (status != STATUS_OK) memset(ok, 0, (size_t)n);
    result = Py_BuildValue("(iLnn)", status, total, opened, reads);
done:
    PyMem_RawFree(ord);
    release(&sh), release(&sl), release(&sp), release(&ds), release(&out), release(&okb);
    release(&ch), release(&cd);
    return result;
}

static PyObject *decode_blobs(PyObject *self, PyObject *args) {
    PyObject *blobs_o, *dst_o, *out_o;
    Py_ssize_t row_bytes;
    int checksum;
    if (!PyArg_ParseTuple(args, "OOOnp", &blobs_o, &dst_o, &out_o, &row_bytes, &checksum))
        return NULL;
    PyObject *seq = PySequence_Fast(blobs_o, "blobs must be a sequence of bytes-like objects");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    held_buffer dst = {0}, out = {0};
    held_buffer *views = PyMem_Calloc(n ? n : 1, sizeof(held_buffer));
    PyObject *result = NULL;
    if (views == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (take(dst_o, &dst, 8, 0, "dst") || take(out_o, &out, 0, 1, "out")) goto done;
    if (dst.view.len / 8 != n || row_bytes <= 0) {
        PyErr_SetString(PyExc_ValueError, "dst must have one entry per blob; row_bytes must "
                                          "be positive");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (take(PySequence_Fast_GET_ITEM(seq, i), &views[i], 0, 0, "blob")) goto done;
    const int64_t *dr = dst.view.buf;
    uint8_t *o = out.view.buf;
    Py_ssize_t out_rows = out.view.len / row_bytes;
    int status = STATUS_OK;
    Py_ssize_t i = 0;
    scratch_t tmp = {0};
    Py_BEGIN_ALLOW_THREADS
    for (; i < n; i++) {
        if (dr[i] < 0 || dr[i] >= out_rows) { status = STATUS_BOUNDS; break; }
        status = decode_chunk(views[i].view.buf, (size_t)views[i].view.len, checksum,
                              o + dr[i] * row_bytes, (size_t)row_bytes, &tmp);
        if (status != STATUS_OK) break;
    }
    Py_END_ALLOW_THREADS
    free(tmp.buf);
    result = Py_BuildValue("(in)", status, status == STATUS_OK ? (Py_ssize_t)-1 : i);
done:
    if (views != NULL) {
        for (Py_ssize_t k = 0; k < n; k++) release(&views[k]);
        PyMem_Free(views);
    }
    release(&dst);
    release(&out);
    Py_DECREF(seq);
    return result;
}

static PyObject *copy_rows(PyObject *self, PyObject *args) {
    PyObject *src_o, *src_rows_o, *dst_o, *dst_rows_o;
    Py_ssize_t row_bytes;
    if (!PyArg_ParseTuple(args, "OOOOn", &src_o, &src_rows_o, &dst_o, &dst_rows_o, &row_bytes))
        return NULL;
    held_buffer src = {0}, sr = {0}, dst = {0}, dr = {0};
    PyObject *result = NULL;
    if (take(src_o, &src, 0, 0, "src") || take(src_rows_o, &sr, 8, 0, "src_rows") ||
        take(dst_o, &dst, 0, 1, "dst"))
        goto done;
    int sequential = dst_rows_o == Py_None;
    if (!sequential && take(dst_rows_o, &dr, 8, 0, "dst_rows")) goto done;
    Py_ssize_t n = sr.view.len / 8;
    if (row_bytes <= 0 || (!sequential && dr.view.len / 8 != n)) {
        PyErr_SetString(PyExc_ValueError, "src_rows and dst_rows must have one entry per "
                                          "row; row_bytes must be positive");
        goto done;
    }
    const int64_t *si = sr.view.buf, *di = sequential ? NULL : dr.view.buf;
    Py_ssize_t src_n = src.view.len / row_bytes, dst_n = dst.view.len / row_bytes;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t d = sequential ? i : di[i];
        if (si[i] < 0 || si[i] >= src_n || d < 0 || d >= dst_n) {
            PyErr_Format(PyExc_IndexError, "copy_rows: row %zd out of range", i);
            goto done;
        }
    }
    const uint8_t *s = src.view.buf;
    uint8_t *o = dst.view.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        memcpy(o + (sequential ? i : di[i]) * row_bytes, s + si[i] * row_bytes,
               (size_t)row_bytes);
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    release(&src);
    release(&sr);
    release(&dst);
    release(&dr);
    return result;
}

static PyObject *py_crc32c(PyObject *self, PyObject *arg) {
    held_buffer b = {0};
    if (take(arg, &b, 0, 0, "data")) {
        release(&b);
        return NULL;
    }
    uint32_t c = crc32c(b.view.buf, (size_t)b.view.len);
    release(&b);
    return PyLong_FromUnsignedLong(c);
}

/* close_shard: see the method table. */
static PyObject *close_shard(PyObject *self, PyObject *args) {
    ReadState *rs;
    Py_ssize_t shard;
    if (!PyArg_ParseTuple(args, "O!n", &ReadStateType, &rs, &shard)) return NULL;
    if (!rs->tab.held || rs->state.view.len / 8 != STATE_LEN) {
        PyErr_SetString(PyExc_ValueError, "close_shard: the ReadState was not set up");
        return NULL;
    }
    if (shard < 0 || shard >= rs->tab.view.len / (8 * TAB_COLS)) {
        PyErr_Format(PyExc_IndexError, "close_shard: shard %zd out of range", shard);
        return NULL;
    }
    int64_t *e = (int64_t *)rs->tab.view.buf + shard * TAB_COLS;
    int was_open = e[TAB_FD] >= 0;
    shard_close(e, rs->state.view.buf);
    return PyBool_FromLong(was_open);
}

#include "batch_lookup.h" /* first_index, table_rows, place_rows, rows_held */
#include "hot_gather.h"   /* gather_held */
#include "scalar_codes.h" /* code_rows */

static PyMethodDef methods[] = {
    {"decode_pread", decode_pread, METH_VARARGS,
     "decode_pread(fds, starts, sizes, dst, out, row_bytes, checksum) -> (status, index, "
     "bytes_read)\n\nRead chunk i (pread of fds[i] at starts[i], sizes[i] bytes) and decode "
     "it into row dst[i] of out (row_bytes each). Runs without the GIL."},
    {"decode_blobs", decode_blobs, METH_VARARGS,
     "decode_blobs(blobs, dst, out, row_bytes, checksum) -> (status, index)\n\nDecode "
     "in-memory chunk i into row dst[i] of out. Runs without the GIL."},
    {"read_rows", read_rows, METH_VARARGS,
     "read_rows(state, shards, slots, steps, dst, out, ok[, chunks, chunk_dst]) -> (status, "
     "bytes_read, opened, reads)\n\nRow i (lane step steps[i] at slot slots[i] of shard "
     "shards[i]) into row dst[i] of out (the state's row_bytes each), reading the shard's "
     "file prefix + shard + suffix (state: a ReadState, built once per field of a reader): "
     "the descriptor the state's tab holds for the shard when its header holds that step "
     "and is trusted for it, else the shard opened again (header checked, trusted for "
     "known[lane]; beyond len(ring) open shards the oldest is closed). Each row's 16-byte "
     "index entry is read (remembered per chunk in the state's ecache, direct-mapped, used "
     "again only through the descriptor it was read with), then its chunk, checked and "
     "decoded (chunks of chunk_rows > 1 rows: only the blocks holding the row are decoded). "
     "Rows are taken in (shard, slot) order, a shard's entries read together and chunks "
     "that follow one another in the file with one read. ok[i] = 1 where delivered; rows "
     "not delivered (overwritten, missing, failing a check) are left to the caller. status "
     "STATUS_UNSUPPORTED: a codec this kernel does not decode. Optional chunks, chunk_dst: "
     "a multi-row chunk is decoded at byte chunk_dst[i] of chunks (-1: a scratch buffer), "
     "so the caller can keep it. A state with an arena (and no chunks given): each shard's "
     "compressed chunk read is kept in the arena with its version, and rows of that "
     "version are decoded from it (shard_reads.h). Runs without the GIL."},
    {"close_shard", close_shard, METH_VARARGS,
     "close_shard(state, shard) -> bool\n\nClose the descriptor the state's tab holds for "
     "shard and drop its mapping (shard_maps.h); whether one was open. Call it with no "
     "read_rows of the same state running (FdTable holds its lock)."},
    {"rows_held", rows_held, METH_VARARGS,
     "rows_held(state, shards, slots, steps, out)\n\nout[i] (bool) = whether the version "
     "of shard shards[i] the state's tab holds open holds step steps[i] at slot slots[i] "
     "and is trusted for it (what read_rows reads without opening the shard again)."},
    {"copy_rows", copy_rows, METH_VARARGS,
     "copy_rows(src, src_rows, dst, dst_rows, row_bytes)\n\ndst row dst_rows[i] (or i when "
     "dst_rows is None) = src row src_rows[i]; rows of row_bytes bytes. Bounds-checked first, "
     "then copied without the GIL."},
    {"crc32c", py_crc32c, METH_O, "crc32c(data) -> int (Castagnoli), for tests."},
    {"set_read_depth", set_read_depth, METH_O,
     "set_read_depth(n) -> previous\n\nPreads read_rows keeps in flight per call on the frame "
     "path (1 to 256; 1: one after another, no threads). This process only (read_pool.h)."},
    {"read_depth", get_read_depth, METH_NOARGS, "read_depth() -> n (see set_read_depth)."},
    {"read_pool_threads", read_pool_threads, METH_NOARGS,
     "read_pool_threads() -> n\n\nThreads of this process's read pool (0: not started)."},
    {"first_index", first_index, METH_VARARGS,
     "first_index(keys, first, inv) -> u\n\nDistinct keys (int64 >= 0) in order of first "
     "appearance: first[j] their first positions, inv[i] the j of keys[i]."},
    {"table_rows", table_rows, METH_VARARGS,
     "table_rows(shards, slots, steps, first, n_rows, trusted, slot, values, shard_rows, "
     "out) -> bool\n\nRows of cached decoded shards (ShardTable) into out, when every row "
     "is held and trusted; else False and nothing written."},
    {"gather_held", gather_held, METH_VARARGS,
     "gather_held(shard_rows, spl, known, locs, jobs, copy) -> bool\n\nEvery small field of a "
     "batch from the hot set (ShardTable values) in one call (see hot_gather.h)."},
    {"code_rows", code_rows, METH_VARARGS,
     "code_rows(src, starts, counts, kind, itemsize, bits, low, table, size, dst, "
     "dst_starts, slot_bytes) -> (done, size)\n\nShards' scalar values coded into their "
     "slots in one call (see scalar_codes.h)."},
    {"place_rows", place_rows, METH_VARARGS,
     "place_rows(rows, steps, servable, cacheable, tag, step, n, scratch, pos, hit, own) "
     "-> bool\n\nRowCache.place in one loop; False where scratch is too small."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_kernels",
    "Batch decoding of blosc1/LZ4 inner chunks without Python per row.", -1, methods,
};

PyMODINIT_FUNC PyInit__kernels(void) {
    crc_init();
    if (PyType_Ready(&ReadStateType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&ReadStateType);
    if (PyModule_AddObject(m, "ReadState", (PyObject *)&ReadStateType) < 0) {
        Py_DECREF(&ReadStateType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "STATUS_OK", STATUS_OK);
    PyModule_AddIntConstant(m, "STATUS_READ", STATUS_READ);
    PyModule_AddIntConstant(m, "STATUS_CHECKSUM", STATUS_CHECKSUM);
    PyModule_AddIntConstant(m, "STATUS_CORRUPT", STATUS_CORRUPT);
    PyModule_AddIntConstant(m, "STATUS_UNSUPPORTED", STATUS_UNSUPPORTED);
    PyModule_AddIntConstant(m, "STATUS_BOUNDS", STATUS_BOUNDS);
    PyModule_AddIntConstant(m, "TAB_COLS", TAB_COLS);
    PyModule_AddIntConstant(m, "ECACHE_COLS", ECACHE_COLS);
    PyModule_AddIntConstant(m, "STATE_LEN", STATE_LEN);
    PyModule_AddIntConstant(m, "ST_MAPPED", ST_MAPPED);
    PyModule_AddIntConstant(m, "ST_MAP_BUDGET", ST_MAP_BUDGET);
    PyModule_AddIntConstant(m, "ST_MAP_READS", ST_MAP_READS);
    PyModule_AddIntConstant(m, "ENTRY_BLOCK", EBLOCK);
    PyModule_AddIntConstant(m, "ENTRY_BLOCK_BYTES", EBLOCK_BYTES);
    PyModule_AddIntConstant(m, "ENTRY_OF_COLS", EOF_COLS);
    return m;
}
