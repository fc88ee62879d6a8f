/* Preloaded into the lab's llama-server by scripts/engine_graph.py: prints the exact byte count
 * of each compute buffer the scheduler reserved, which the engine itself prints only in MiB to two
 * decimals. It wraps ggml_backend_sched_get_buffer_size (ggml-backend.cpp), the call
 * llama_context::sched_reserve makes before printing "compute buffer size"; nothing else changes. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>

struct ggml_backend_sched;
struct ggml_backend;

size_t ggml_backend_sched_get_buffer_size(struct ggml_backend_sched * sched, struct ggml_backend * backend) {
    static size_t (*real)(struct ggml_backend_sched *, struct ggml_backend *) = NULL;
    if (real == NULL) {
        real = (size_t (*)(struct ggml_backend_sched *, struct ggml_backend *)) dlsym(RTLD_NEXT, "ggml_backend_sched_get_buffer_size");
    }
    size_t size = real(sched, backend);
    fprintf(stderr, "frank-shim: compute buffer bytes = %zu\n", size);
    fflush(stderr);
    return size;
}
