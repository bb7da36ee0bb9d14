/* SPDX-License-Identifier: Apache-2.0
 * A live UCX worker of the tests' own, standing for a consumer that is not
 * ours (tests/integration/test_addresses.py): it maps a window, prints one
 * line "WORKER_HEX RKEY_HEX WINDOW WINDOW_SIZE" and keeps its worker
 * progressing until its standard input closes. Tests hand its address and
 * key to dyadd as a peer would (a real endpoint, a real key), or bend the
 * key to see dyadd refuse it. */
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <ucp/api/ucp.h>

static void hex(const void* p, size_t n) {
    const unsigned char* b = p;
    for (size_t i = 0; i < n; ++i) printf("%02x", b[i]);
}

static int fail(const char* what, ucs_status_t s) {
    fprintf(stderr, "ucx_peer: %s: %s\n", what, ucs_status_string(s));
    return 1;
}

int main(void) {
    ucp_params_t params;
    memset(&params, 0, sizeof params);
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_TAG | UCP_FEATURE_RMA;
    ucp_config_t* config = NULL;
    ucs_status_t s = ucp_config_read(NULL, NULL, &config);
    if (s != UCS_OK) return fail("ucp_config_read", s);
    ucp_context_h ctx = NULL;
    s = ucp_init(&params, config, &ctx);
    ucp_config_release(config);
    if (s != UCS_OK) return fail("ucp_init", s);

    ucp_worker_params_t wp;
    memset(&wp, 0, sizeof wp);
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    ucp_worker_h worker = NULL;
    s = ucp_worker_create(ctx, &wp, &worker);
    if (s != UCS_OK) return fail("ucp_worker_create", s);
    ucp_address_t* addr = NULL;
    size_t addr_len = 0;
    s = ucp_worker_get_address(worker, &addr, &addr_len);
    if (s != UCS_OK) return fail("ucp_worker_get_address", s);

    ucp_mem_map_params_t mp;
    memset(&mp, 0, sizeof mp);
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    mp.length = 4 << 20;
    mp.flags = UCP_MEM_MAP_ALLOCATE;
    ucp_mem_h mem = NULL;
    s = ucp_mem_map(ctx, &mp, &mem);
    if (s != UCS_OK) return fail("ucp_mem_map", s);
    ucp_mem_attr_t ma;
    ma.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    s = ucp_mem_query(mem, &ma);
    if (s != UCS_OK) return fail("ucp_mem_query", s);
    void* rkey = NULL;
    size_t rkey_len = 0;
    s = ucp_rkey_pack(ctx, mem, &rkey, &rkey_len);
    if (s != UCS_OK) return fail("ucp_rkey_pack", s);

    hex(addr, addr_len);
    printf(" ");
    hex(rkey, rkey_len);
    printf(" %llu %zu\n", (unsigned long long)(uintptr_t)ma.address, ma.length);
    fflush(stdout);
    ucp_rkey_buffer_release(rkey);

    struct pollfd in = {.fd = 0, .events = POLLIN};
    for (;;) {
        while (ucp_worker_progress(worker) != 0) {
        }
        int r = poll(&in, 1, 1);
        if (r > 0) {
            char buf[64];
            if (fread(buf, 1, sizeof buf, stdin) == 0) break;
        }
    }
    ucp_mem_unmap(ctx, mem);
    ucp_worker_release_address(worker, addr);
    ucp_worker_destroy(worker);
    ucp_cleanup(ctx);
    return 0;
}
