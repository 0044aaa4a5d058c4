/*
 * cpu/threads.c — the CPU path's fork-join: threads over work items, each item
 * a piece of output that one thread computes alone, start to end, in the fixed
 * order of the split plan (docs/design.md, "cpu-path"). Which thread takes which
 * item is left to the moment; bits cannot depend on it.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/kernels.h"

/* At most this many threads per call (the rest of a larger count goes unused). */
#define FAD_CPU_MAX_THREADS 256

typedef struct pool_job {
    atomic_llong next;
    int64_t n_items;
    void (*fn)(void *ctx, int64_t item, void *scratch);
    void *ctx;
} pool_job;

typedef struct pool_worker {
    pool_job *job;
    void *scratch;
} pool_worker;

static void *run_items(void *arg)
{
    pool_worker *w = (pool_worker *)arg;
    pool_job *job = w->job;
    for (;;) {
        const int64_t item = atomic_fetch_add(&job->next, 1);
        if (item >= job->n_items)
            break;
        job->fn(job->ctx, item, w->scratch);
    }
    return NULL;
}

int fad_cpu_parallel(int num_threads, int64_t n_items, size_t scratch_bytes,
                     void (*fn)(void *ctx, int64_t item, void *scratch), void *ctx)
{
    if (n_items <= 0)
        return 0;
    int n = num_threads < 1 ? 1 : num_threads > FAD_CPU_MAX_THREADS ? FAD_CPU_MAX_THREADS : num_threads;
    if (n > n_items)
        n = (int)n_items;
    const size_t bytes = (scratch_bytes + 63) / 64 * 64;
    pool_worker workers[FAD_CPU_MAX_THREADS];
    pthread_t tids[FAD_CPU_MAX_THREADS];
    pool_job job;
    atomic_init(&job.next, 0);
    job.n_items = n_items, job.fn = fn, job.ctx = ctx;
    for (int t = 0; t < n; t++) {
        workers[t].job = &job;
        workers[t].scratch = NULL;
        if (bytes && !(workers[t].scratch = aligned_alloc(64, bytes))) {
            for (int u = 0; u < t; u++)
                free(workers[u].scratch);
            return -1;
        }
        if (bytes)
            memset(workers[t].scratch, 0, 64);
    }
    /* threads that cannot be started leave their share to the others */
    int started = 0;
    for (int t = 1; t < n; t++) {
        if (pthread_create(&tids[started + 1], NULL, run_items, &workers[t]) != 0)
            break;
        started++;
    }
    run_items(&workers[0]);
    for (int t = 1; t <= started; t++)
        pthread_join(tids[t], NULL);
    for (int t = 0; t < n; t++)
        free(workers[t].scratch);
    return 0;
}
