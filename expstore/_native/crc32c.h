/* crc32c (Castagnoli): for every C source that checks or writes the crc32c of stored bytes
 * (storage/native/_kernels.c reads, _write.c encodes). The x86-64 SSE4.2 instruction where
 * the processor has it (~8 GB/s: a small field's 4096-row chunk read for one row is
 * mostly its checksum), else slicing-by-8 (~1.5 GB/s); the same values. Call crc_init()
 * once, in the module's init, before crc32c(). Static: each translation unit that
 * includes this gets its own copy (and table). */
#ifndef EXPSTORE_CRC32C_H
#define EXPSTORE_CRC32C_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static uint32_t crc_table[8][256];
static int crc_hw; /* the processor has the SSE4.2 crc32 instruction (crc_init) */

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CRC_HW_BUILT 1
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(const uint8_t *p, size_t n) {
    uint64_t c = 0xFFFFFFFFu;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = __builtin_ia32_crc32di(c, w);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
    return c32 ^ 0xFFFFFFFFu;
}
#endif

static void crc_init(void) {
#ifdef CRC_HW_BUILT
    __builtin_cpu_init();
    crc_hw = __builtin_cpu_supports("sse4.2");
#endif
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = crc_table[0][n];
        for (int k = 1; k < 8; k++) {
            c = crc_table[0][c & 0xff] ^ (c >> 8);
            crc_table[k][n] = c;
        }
    }
}

static uint32_t crc32c(const uint8_t *p, size_t n) {
#ifdef CRC_HW_BUILT
    if (crc_hw) return crc32c_hw(p, n);
#endif
    uint32_t c = 0xFFFFFFFFu;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= c;
        c = crc_table[7][w & 0xff] ^ crc_table[6][(w >> 8) & 0xff] ^
            crc_table[5][(w >> 16) & 0xff] ^ crc_table[4][(w >> 24) & 0xff] ^
            crc_table[3][(w >> 32) & 0xff] ^ crc_table[2][(w >> 40) & 0xff] ^
            crc_table[1][(w >> 48) & 0xff] ^ crc_table[0][w >> 56];
        p += 8;
        n -= 8;
    }
#endif
    while (n--) c = crc_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

#endif
