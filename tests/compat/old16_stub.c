/* SPDX-License-Identifier: Apache-2.0 */
/* Stand-in for a libdyad.so.0 of before 2026, without symbol versions: only
 * what old16.c links against (never run). */
#include <stdbool.h>
int dyad_init(bool a, bool b, bool c, bool d, bool e, bool f, unsigned g, unsigned h, unsigned i,
              const char* j, const char* k, const char* l, bool m, const char* n, int o, void* p) {
    (void)a, (void)b, (void)c, (void)d, (void)e, (void)f, (void)g, (void)h, (void)i, (void)j;
    (void)k, (void)l, (void)m, (void)n, (void)o, (void)p;
    return -1;
}
void* dyad_ctx_get(void) {
    return 0;
}
int dyad_finalize(void) {
    return 0;
}
const struct { char bytes[152]; } dyad_ctx_default = {{0}};
