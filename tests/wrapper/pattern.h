/* SPDX-License-Identifier: Apache-2.0 */
/* Deterministic content: byte at offset o of file k. */
#pragma once
#include <stddef.h>
static inline unsigned char dyad_test_byte(unsigned k, size_t o) {
    return (unsigned char)((k * 131u + o * 7u + (o >> 12)) & 0xff);
}
