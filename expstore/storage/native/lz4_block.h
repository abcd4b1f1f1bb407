/*
 * The LZ4 block decoder of the read kernel (included by ``_kernels.c`` only).
 *
 * lz4_prefix decodes one LZ4 block (a blosc stream), whole or only until a prefix of it
 * is out (a row of a multi-row chunk). Every length and offset read from the data is
 * bounds-checked: corrupt input cannot make it read or write outside its buffers. Its
 * moves may write past a piece's end, but only inside the block, where later pieces write
 * over it; a prefix decode may leave bytes past the prefix written (the caller reads the
 * prefix only).
 */
#ifndef EXPSTORE_LZ4_BLOCK_H
#define EXPSTORE_LZ4_BLOCK_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* A literal or match length of 15 goes on in the bytes after it: each is added, until
   one under 255. 0, or -1 where they run past `iend`. */
static int add_length(const uint8_t **ip, const uint8_t *iend, size_t *len) {
    unsigned s;
    do {
        if (*ip >= iend) return -1;
        s = *(*ip)++;
        *len += s;
    } while (s == 255);
    return 0;
}

/* Decode one LZ4 block of exactly `dstlen` bytes, or (want < dstlen) only until its first
   `want` bytes are out; 0 on success, -1 if corrupt. */
static int lz4_prefix(const uint8_t *ip, size_t srclen, uint8_t *dst, size_t dstlen,
                      size_t want) {
    const uint8_t *iend = ip + srclen;
    uint8_t *op = dst, *oend = dst + dstlen, *owant = dst + (want < dstlen ? want : dstlen);
    for (;;) {
        if (want < dstlen && op >= owant) return 0;
        if (ip >= iend) return -1;
        unsigned token = *ip++;
        size_t lit = token >> 4;
        /* The common sequence first (as LZ4's own decoder does): under 15 literals and a
           match of at most 18 bytes at least 16 back, away from both ends: one 16-byte
           move of literals, one of the match (two bytes more for a 17- or 18-byte one).
           Writes stay below op + 32 <= oend; reads below ip + 18 <= iend. Any other
           match goes on below with its literals already out. */
        if (lit < 15 && (token & 15) < 15 && iend - ip >= 18 && oend - op >= 32 &&
            (size_t)(owant - op) > lit) {
            memcpy(op, ip, 16);
            op += lit;
            ip += lit;
            size_t off = (size_t)ip[0] | ((size_t)ip[1] << 8);
            if (off >= 16 && off <= (size_t)(op - dst)) {
                size_t mlen = (token & 15) + 4;
                ip += 2;
                memcpy(op, op - off, 16);
                if (mlen > 16) memcpy(op + 16, op + 16 - off, 2);
                op += mlen;
                continue;
            }
            goto match;
        }
        if (lit == 15 && add_length(&ip, iend, &lit) != 0) return -1;
        if ((size_t)(iend - ip) < lit || (size_t)(oend - op) < lit) return -1;
        if (want < dstlen && lit >= (size_t)(owant - op)) { /* the prefix ends in these */
            memcpy(op, ip, (size_t)(owant - op));
            return 0;
        }
        if (lit <= 16 && iend - ip >= 16 && oend - op >= 16)
            memcpy(op, ip, 16); /* one 16-byte move; the bytes past `lit` are written over */
        else
            memcpy(op, ip, lit);
        op += lit;
        ip += lit;
        if (ip == iend) break; /* the last sequence holds literals only */
        if (want < dstlen && op >= owant) return 0;
    match:
        if (iend - ip < 2) return -1;
        size_t off = (size_t)ip[0] | ((size_t)ip[1] << 8);
        ip += 2;
        if (off == 0 || off > (size_t)(op - dst)) return -1;
        size_t mlen = token & 15;
        if (mlen == 15 && add_length(&ip, iend, &mlen) != 0) return -1;
        mlen += 4;
        if ((size_t)(oend - op) < mlen) return -1;
        /* The match may overlap its own output (a repeating pattern of period `off`):
           a run of one byte is a memset; at least 16 bytes back, 16-byte moves (each reads
           bytes already written; the last may write up to 15 bytes past the match, which
           later sequences write over, when that stays within `dst`); 2 to 15 bytes back,
           8-byte moves once the first 8 bytes are out (as LZ4's own decoder does: after
           them the source is a multiple of the period and at least 8 bytes back; up to 7
           bytes written past the match); without that room, a short one byte by byte and
           a long one in whole periods, doubling, so each memcpy reads bytes written. */
        if (off == 1) {
            memset(op, op[-1], mlen);
            op += mlen;
            continue;
        }
        if (off >= 16 && (size_t)(oend - op) >= mlen + 15) {
            for (size_t k = 0; k < mlen; k += 16) memcpy(op + k, op + k - off, 16);
            op += mlen;
            continue;
        }
        if ((size_t)(oend - op) >= mlen + 8) {
            static const unsigned inc32[8] = {0, 1, 2, 1, 0, 4, 4, 4};
            static const int dec64[8] = {0, 0, 0, -1, -4, 1, 2, 3};
            uint8_t *d = op, *e = op + mlen;
            const uint8_t *s = op - off;
            if (off == 2 || off == 4) { /* (Atari frames: mostly 2 bytes back) */
                uint64_t pat; /* the period in a register: no load of bytes just stored */
                if (off == 2) {
                    uint16_t v;
                    memcpy(&v, s, 2);
                    pat = v * 0x0001000100010001ULL;
                } else {
                    uint32_t v;
                    memcpy(&v, s, 4);
                    pat = v * 0x0000000100000001ULL;
                }
                for (; d < e; d += 8) memcpy(d, &pat, 8);
                op = e;
                continue;
            }
            if (off < 8) {
                d[0] = s[0];
                d[1] = s[1];
                d[2] = s[2];
                d[3] = s[3];
                s += inc32[off];
                memcpy(d + 4, s, 4);
                s -= dec64[off];
            } else {
                memcpy(d, s, 8);
                s += 8;
            }
            for (d += 8; d < e; d += 8, s += 8) memcpy(d, s, 8);
            op = e;
            continue;
        }
        if (mlen <= 64) { /* a short pattern near the block's end */
            for (size_t k = 0; k < mlen; k++) op[k] = op[k - off];
            op += mlen;
            continue;
        }
        size_t done = 0;
        while (done < mlen) {
            size_t c = done + off;
            if (c > mlen - done) c = mlen - done;
            memcpy(op + done, op - off, c);
            done += c;
        }
        op += mlen;
    }
    return op == oend || (want < dstlen && op >= owant) ? 0 : -1;
}

#endif
