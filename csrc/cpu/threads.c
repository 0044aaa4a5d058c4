/*
 * cpu/threads.c — the CPU path's fork-join: threads over work items, each item
 * a piece of output that one thread computes alone, start to end, in the fixed
 * order of the split plan (docs/design.md, "cpu-path"). Which thread takes which
 * item is left to the moment; bits cannot depend on it.
 *
 * The threads are torch's own where the process has them: with torch imported
 * its OpenMP runtime (GNU libgomp) is in the global symbol scope, and a team of
 * its threads runs the items (GOMP_parallel, what `#pragma omp parallel`
 * compiles to). After each of torch's parallel regions its workers keep
 * spinning for a while; threads of our own, started beside them, shared the
 * cores with that spinning, and a CPU call right after a torch op took about
 * twice its time (2 cores: 6.8-7.1 ms against 3.4 ms alone, B1 L512 H8 D64).
 * Without that runtime (the C API alone), pthreads.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
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

/* libgomp's entry points, looked up once (NULL without it) */
typedef void (*gomp_parallel_fn)(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags);
typedef int (*omp_thread_num_fn)(void);
static gomp_parallel_fn gomp_parallel;
static omp_thread_num_fn omp_thread_num;
static pthread_once_t gomp_once = PTHREAD_ONCE_INIT;
static void gomp_lookup(void)
{
    /* (copied, not cast: ISO C has no conversion from an object pointer to a
     * function pointer; POSIX guarantees the representation) */
    void *par = dlsym(RTLD_DEFAULT, "GOMP_parallel"), *num = dlsym(RTLD_DEFAULT, "omp_get_thread_num");
    if (par && num && !getenv("FLASH_ATTN_DET_CPU_PTHREADS")) {
        memcpy(&gomp_parallel, &par, sizeof par);
        memcpy(&omp_thread_num, &num, sizeof num);
    }
}

typedef struct team {
    pool_worker *workers;
    int n;
} team;

/* Each thread of the team takes items as a worker of ours (its scratch by its
 * thread number; a team smaller than asked leaves the rest unused). */
static void team_run(void *arg)
{
    const team *t = (const team *)arg;
    const int i = omp_thread_num();
    if (i >= 0 && i < t->n)
        run_items(&t->workers[i]);
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
    pthread_once(&gomp_once, gomp_lookup);
    if (gomp_parallel && n > 1) {
        const team tm = {workers, n};
        gomp_parallel(team_run, (void *)&tm, (unsigned)n, 0);
    } else {
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
    }
    for (int t = 0; t < n; t++)
        free(workers[t].scratch);
    return 0;
}
