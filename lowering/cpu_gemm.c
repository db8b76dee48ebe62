/* fflow's GEMM pool in C: large GEMMs cut into chunks of the output, each chunk one
 * single-threaded cblas call; workers are pthreads that block on a condition variable
 * between jobs (no spinning between GEMMs, no Python GIL). The caller computes chunks
 * too and, while it waits for the workers, computes a chunk a worker holds into
 * scratch and publishes it itself (the first copy to arrive wins, the same bits) as
 * soon as that worker is seen descheduled (its CPU-time clock stands still), or after
 * twice its own chunk time, so a worker the OS descheduled cannot stall the step.
 * fflow_pool_stats counts the chunks, backups and waits. Publishing takes no lock: the first copy claims the chunk (0 -> 2) with
 * one atomic exchange and writes it outside any lock, so a worker preempted in the
 * middle of its copy holds up nothing but the caller's final wait for that chunk (a
 * mutex held for the copy made the caller's next publish sleep a time slice).
 *
 * Late workers may still read A and B after fflow_gemm returns: the caller keeps the
 * operands alive until fflow_gemm_busy(job) says the job was released.
 *
 * fflow_parallel runs a native elementwise loop the same way (axis 3): chunks of its
 * index range, `fn(args, out_chunk, s, e)` writing outputs s..e-1 to out_chunk.
 *
 * Epilogues: a 2-D GEMM may carry `epi(args, r0, r1, c0, c1, acc)`, a native loop of
 * the program (lowering/cpu_epilogue.py) that post-processes rows r0..r1, columns
 * c0..c1 of C (bias add, activation, ReLU mask, SGD update) into its outputs and adds
 * its `nsum` column sums into acc[q * N + c] (doubles). It runs once per chunk, by the
 * thread that computed the chunk, right after the chunk is in C (still in cache): the
 * caller's chunks after their GEMM, a worker's in `publish` after the copy out of
 * scratch, only when that copy is the one that wins. Row chunks add into their own
 * acc rows, summed in chunk order once every chunk is in (the same order for any
 * timing); then `fin(args, acc)` writes the sums.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAXCH 64
#define MAXW 64
#define STALL 30e-6 /* seconds a worker's CPU clock is watched before judging it */

typedef void (*sgemm64_t)(int, int, int, long, long, long, float, const float *, long,
                          const float *, long, float, float *, long);
typedef void (*dgemm64_t)(int, int, int, long, long, long, double, const double *, long,
                          const double *, long, double, double *, long);
typedef void (*sgemm32_t)(int, int, int, int, int, int, float, const float *, int,
                          const float *, int, float, float *, int);
typedef void (*dgemm32_t)(int, int, int, int, int, int, double, const double *, int,
                          const double *, int, double, double *, int);

static void *g_sgemm, *g_dgemm;
static int g_ilp64;

typedef void (*epi_t)(const long *, long, long, long, long, double *);
typedef void (*fin_t)(const long *, const double *);

typedef struct job {
  int isz, ta, tb;                 /* item size; 111 no transpose, 112 transpose */
  long M, N, K, lda, ldb, ldc;
  const char *A, *B;
  char *C;
  long nb0, nb1;                   /* batch shape (1, 1 for none) */
  long sa0, sa1, sb0, sb1, sc0, sc1; /* batch strides in bytes */
  int axis;                        /* 0 batch, 1 rows of C, 2 columns of C, 3 range,
                                      4 list (chunk k: the k-th GEMM of `list`) */
  struct job *list;                /* axis 4: one job per GEMM (owned) */
  void (*fn)(long *, char *, long, long); /* axis 3: the loop over one chunk */
  long *args;                      /* axis 3: its pointers (owned by the job) */
  long unit;                       /* axis 3: output bytes per index */
  epi_t epi;                       /* axis 1, 2, 4 (per GEMM): the epilogue, or NULL */
  fin_t fin;                       /* writes its column sums from acc, or NULL */
  long *epi_args;                  /* its pointers (owned by the job) */
  long nsum;                       /* its column sums */
  double *acc;                     /* their accumulators: nsum x N (axis 1: per chunk) */
  int n;
  long bounds[MAXCH + 1];
  int next, left, refs, max_workers, joined, error;
  unsigned char finished[MAXCH];   /* 0 open, 2 being written (claimed), 1 done */
  unsigned char owner[MAXCH];      /* the worker computing chunk k (index + 1), or 0 */
  pthread_mutex_t lock;            /* joined and refs */
} job_t;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_wake = PTHREAD_COND_INITIALIZER;
static job_t *g_job;
static long g_gen;
static long g_spin_ns;  /* how long a worker polls for the next job (fflow_pool_step) */
static long g_epoch;   /* bumped at every step's end: polling workers block */
static int g_workers;
static clockid_t g_clock[MAXW]; /* each worker's CPU-time clock */
static pthread_t g_thread[MAXW];
static long g_tid[MAXW];        /* each worker's kernel thread id (fflow_pool_worker_tid) */
static int g_kept_off = -1;     /* the CPU the workers are kept off (keep_off), or -1 */
static int g_has_clock[MAXW];
/* counters (fflow_pool_stats): jobs shared with workers, chunks the caller computed
 * in place, chunks workers published, backups the caller computed, backups that won,
 * nanoseconds the caller waited for workers, backups started because the worker was
 * seen descheduled, backups started because the wait outlasted twice a chunk, CPU
 * nanoseconds workers spent on chunks (what one thread would have had to do too) */
#define NSTATS 9
static long g_stats[NSTATS];
#define STAT(i, v) __atomic_add_fetch(&g_stats[i], (v), __ATOMIC_RELAXED)

static void gemm(const job_t *j, long M, long N, const char *A, const char *B, char *C, long ldc) {
  if (j->isz == 4) {
    if (g_ilp64)
      ((sgemm64_t)g_sgemm)(101, j->ta, j->tb, M, N, j->K, 1.0f, (const float *)A, j->lda,
                           (const float *)B, j->ldb, 0.0f, (float *)C, ldc);
    else
      ((sgemm32_t)g_sgemm)(101, j->ta, j->tb, (int)M, (int)N, (int)j->K, 1.0f, (const float *)A,
                           (int)j->lda, (const float *)B, (int)j->ldb, 0.0f, (float *)C, (int)ldc);
  } else {
    if (g_ilp64)
      ((dgemm64_t)g_dgemm)(101, j->ta, j->tb, M, N, j->K, 1.0, (const double *)A, j->lda,
                           (const double *)B, j->ldb, 0.0, (double *)C, ldc);
    else
      ((dgemm32_t)g_dgemm)(101, j->ta, j->tb, (int)M, (int)N, (int)j->K, 1.0, (const double *)A,
                           (int)j->lda, (const double *)B, (int)j->ldb, 0.0, (double *)C, (int)ldc);
  }
}

/* Chunk k into `dst` (NULL: straight into C). Returns the bytes of a scratch chunk. */
static long chunk_bytes(const job_t *j, int k) {
  if (j->axis == 4) return j->list[k].M * j->list[k].N * j->list[k].isz;
  long s = j->bounds[k], e = j->bounds[k + 1];
  if (j->axis == 3) return (e - s) * j->unit;
  if (j->axis == 0) return (e - s) * j->M * j->N * j->isz;
  if (j->axis == 1) return (e - s) * j->N * j->isz;
  return j->M * (e - s) * j->isz;
}

static void run_chunk(const job_t *j, int k, char *dst) {
  long s = j->bounds[k], e = j->bounds[k + 1];
  long isz = j->isz;
  if (j->axis == 4) {
    const job_t *g = &j->list[k];
    gemm(g, g->M, g->N, g->A, g->B, dst ? dst : g->C, dst ? g->N : g->ldc);
  } else if (j->axis == 3) {
    j->fn(j->args, dst ? dst : j->C + s * j->unit, s, e);
  } else if (j->axis == 0) {
    for (long b = s; b < e; b++) {
      long b0 = b / j->nb1, b1 = b % j->nb1;
      const char *A = j->A + b0 * j->sa0 + b1 * j->sa1;
      const char *B = j->B + b0 * j->sb0 + b1 * j->sb1;
      char *C = dst ? dst + (b - s) * j->M * j->N * isz : j->C + b0 * j->sc0 + b1 * j->sc1;
      gemm(j, j->M, j->N, A, B, C, dst ? j->N : j->ldc);
    }
  } else if (j->axis == 1) { /* rows s..e of C: rows of A (or its columns when transposed) */
    const char *A = j->A + (j->ta == 111 ? s * j->lda : s) * isz;
    char *C = dst ? dst : j->C + s * j->ldc * isz;
    gemm(j, e - s, j->N, A, j->B, C, dst ? j->N : j->ldc);
  } else { /* columns s..e of C */
    const char *B = j->B + (j->tb == 111 ? s : s * j->ldb) * isz;
    char *C = dst ? dst : j->C + s * isz;
    gemm(j, j->M, e - s, j->A, B, C, dst ? e - s : j->ldc);
  }
}

/* The epilogue of chunk k, on its region of C (C holds the chunk's product). */
static void epilogue(const job_t *j, int k) {
  if (j->axis == 4) {
    const job_t *g = &j->list[k];
    if (g->epi) g->epi(g->epi_args, 0, g->M, 0, g->N, g->acc);
  } else if (j->epi) {
    long s = j->bounds[k], e = j->bounds[k + 1];
    if (j->axis == 1)
      j->epi(j->epi_args, s, e, 0, j->N, j->acc ? j->acc + k * j->nsum * j->N : NULL);
    else
      j->epi(j->epi_args, 0, j->M, s, e, j->acc);
  }
}

/* Every chunk is in: add up the row chunks' column sums (chunk order), write them. */
static void finish(job_t *j) {
  if (j->axis == 4) {
    for (int k = 0; k < j->n; k++)
      if (j->list[k].fin) j->list[k].fin(j->list[k].epi_args, j->list[k].acc);
    return;
  }
  if (!j->fin) return;
  long w = j->nsum * j->N;
  if (j->axis == 1)
    for (int k = 1; k < j->n; k++)
      for (long i = 0; i < w; i++) j->acc[i] += j->acc[k * w + i];
  j->fin(j->epi_args, j->acc);
}

/* Chunk k is in: `scratch` holds a worker's (or a backup's) copy, or NULL when the
 * caller computed it in place (it claimed k, no one else has it). The first copy to
 * claim k writes it and runs its epilogue; later copies are dropped. */
static int publish(job_t *j, int k, const char *scratch) {
  unsigned char open = 0;
  if (!__atomic_compare_exchange_n(&j->finished[k], &open, 2, 0, __ATOMIC_ACQ_REL,
                                   __ATOMIC_ACQUIRE))
    return 0;
  if (scratch) {
    long s = j->bounds[k], e = j->bounds[k + 1], isz = j->isz;
    if (j->axis == 4) {
      const job_t *g = &j->list[k];
      for (long r = 0; r < g->M; r++)
        memcpy(g->C + r * g->ldc * g->isz, scratch + r * g->N * g->isz, g->N * g->isz);
    } else if (j->axis == 3) {
      memcpy(j->C + s * j->unit, scratch, (e - s) * j->unit);
    } else if (j->axis == 0) {
      long mn = j->M * j->N * isz;
      for (long b = s; b < e; b++) {
        long b0 = b / j->nb1, b1 = b % j->nb1;
        char *C = j->C + b0 * j->sc0 + b1 * j->sc1;
        for (long r = 0; r < j->M; r++)
          memcpy(C + r * j->ldc * isz, scratch + (b - s) * mn + r * j->N * isz, j->N * isz);
      }
    } else if (j->axis == 1) {
      for (long r = s; r < e; r++)
        memcpy(j->C + r * j->ldc * isz, scratch + (r - s) * j->N * isz, j->N * isz);
    } else {
      long w = (e - s) * isz;
      for (long r = 0; r < j->M; r++) memcpy(j->C + (r * j->ldc + s) * isz, scratch + r * w, w);
    }
    epilogue(j, k); /* only the copy that wins runs it: once per chunk */
  }
  __atomic_store_n(&j->finished[k], 1, __ATOMIC_RELEASE);
  __atomic_sub_fetch(&j->left, 1, __ATOMIC_ACQ_REL);
  return 1;
}

static void release(job_t *j) {
  pthread_mutex_lock(&j->lock);
  int last = --j->refs == 0;
  pthread_mutex_unlock(&j->lock);
  if (last) {
    pthread_mutex_destroy(&j->lock);
    free(j->args);
    free(j->epi_args);
    free(j->acc);
    if (j->list)
      for (int k = 0; k < j->n; k++) {
        free(j->list[k].epi_args);
        free(j->list[k].acc);
      }
    free(j->list);
    free(j);
  }
}

/* The caller's end of a job: 1 when no worker holds it any more (released here, so
 * the caller needs no second call), else the handle for fflow_gemm_busy. */
static long handle(job_t *j) {
  pthread_mutex_lock(&j->lock);
  int busy = j->refs > 1;
  pthread_mutex_unlock(&j->lock);
  if (busy) return (long)j;
  release(j);
  return 1;
}

static double now(void);

static long thread_cpu_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1000000000L + t.tv_nsec;
}

/* Within a step the next job follows the last within microseconds (the Python between
 * two GEMMs), while waking a blocked thread costs tens of them: a worker polls for the
 * next job for up to g_spin_ns before it blocks, as long as the step that set
 * it runs (fflow_pool_step: 0 at the step's end stops every poll at once). */
static void poll_for_job(long seen) {
  long window = __atomic_load_n(&g_spin_ns, __ATOMIC_ACQUIRE);
  if (window <= 0) return;
  long epoch = __atomic_load_n(&g_epoch, __ATOMIC_ACQUIRE);
  double until = now() + 1e-9 * window;
  while (__atomic_load_n(&g_gen, __ATOMIC_ACQUIRE) == seen &&
         __atomic_load_n(&g_epoch, __ATOMIC_ACQUIRE) == epoch && now() < until)
    for (int i = 0; i < 16; i++) __builtin_ia32_pause();
}

static void *worker(void *arg) {
  int me = (int)(long)arg;
  __atomic_store_n(&g_tid[me], (long)syscall(SYS_gettid), __ATOMIC_RELEASE);
  if (pthread_getcpuclockid(pthread_self(), &g_clock[me]) == 0)
    __atomic_store_n(&g_has_clock[me], 1, __ATOMIC_RELEASE);
  long seen = 0;
  for (;;) {
    poll_for_job(seen);
    pthread_mutex_lock(&g_lock);
    while (g_gen == seen) pthread_cond_wait(&g_wake, &g_lock);
    seen = g_gen;
    job_t *j = g_job;
    int join = 0;
    if (j) {
      pthread_mutex_lock(&j->lock);
      if (j->joined < j->max_workers && __atomic_load_n(&j->left, __ATOMIC_ACQUIRE) > 0) {
        j->joined++;
        j->refs++;
        join = 1;
      }
      pthread_mutex_unlock(&j->lock);
    }
    pthread_mutex_unlock(&g_lock);
    if (!join) continue;
    for (;;) {
      int k = __atomic_fetch_add(&j->next, 1, __ATOMIC_SEQ_CST);
      if (k >= j->n) break;
      __atomic_store_n(&j->owner[k], (unsigned char)(me + 1), __ATOMIC_RELEASE);
      char *scratch = malloc(chunk_bytes(j, k));
      if (!scratch) {
        j->error = 1;
        publish(j, k, NULL);
        continue;
      }
      long c0 = thread_cpu_ns();
      run_chunk(j, k, scratch);
      STAT(2, publish(j, k, scratch));
      free(scratch);
      STAT(8, thread_cpu_ns() - c0);
    }
    release(j);
  }
  return NULL;
}

int fflow_gemm_init(int workers, void *sgemm, void *dgemm, int ilp64) {
  g_sgemm = sgemm;
  g_dgemm = dgemm;
  g_ilp64 = ilp64;
  if (workers > MAXW) workers = MAXW;
  for (int w = g_workers; w < workers; w++) {
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &attr, worker, (void *)(long)w) != 0) break;
    g_thread[w] = t;
    pthread_attr_destroy(&attr);
    g_workers = w + 1;
  }
  return g_workers;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

static void keep_off(int cpu);

/* Publish job j to the workers, compute chunks here, back up late ones. */
static void lead(job_t *j) {
  pthread_mutex_init(&j->lock, NULL);
  if (__atomic_load_n(&g_spin_ns, __ATOMIC_ACQUIRE) > 0) keep_off(sched_getcpu()); /* moved? */

  if (j->max_workers > 0) {
    pthread_mutex_lock(&g_lock);
    g_job = j;
    __atomic_add_fetch(&g_gen, 1, __ATOMIC_ACQ_REL);
    pthread_cond_broadcast(&g_wake);
    pthread_mutex_unlock(&g_lock);
  }

  double t0 = now();
  int mine = 0;
  for (;;) {
    int k = __atomic_fetch_add(&j->next, 1, __ATOMIC_SEQ_CST);
    if (k >= j->n) break;
    run_chunk(j, k, NULL);
    epilogue(j, k);
    mine++;
    publish(j, k, NULL);
  }
  STAT(1, mine);
  if (j->max_workers > 0) STAT(0, 1);
  /* Wait for the workers' chunks by spinning: sleeping here would hand the core to
   * another process, and on a busy machine getting it back takes longer than
   * computing the chunks ourselves. Back a chunk up (compute it here) as soon as the
   * worker holding it is seen descheduled: its CPU-time clock advanced less than half
   * the wall time over the last STALL seconds (another process has its core); or
   * when the wait outlasts twice our own chunk time (a worker that runs but slowly). */
  double t1 = now();
  double per_chunk = mine ? (t1 - t0) / mine : 1e-3;
  double deadline = t1 + (2 * per_chunk < 1e-4 ? 1e-4 : 2 * per_chunk);
  double since[MAXW];
  long cpu0[MAXW];
  int watched[MAXW];
  memset(watched, 0, sizeof watched);
  while (__atomic_load_n(&j->left, __ATOMIC_SEQ_CST) > 0) {
    double t = now();
    int late = t >= deadline, backups = 0;
    for (int k = 0; k < j->n; k++) {
      if (__atomic_load_n(&j->finished[k], __ATOMIC_SEQ_CST)) continue;
      int w = __atomic_load_n(&j->owner[k], __ATOMIC_ACQUIRE) - 1;
      int stalled = 0;
      if (!late && w >= 0 && __atomic_load_n(&g_has_clock[w], __ATOMIC_ACQUIRE)) {
        struct timespec c;
        if (clock_gettime(g_clock[w], &c) == 0) {
          long cpu = c.tv_sec * 1000000000L + c.tv_nsec;
          if (!watched[w]) {
            watched[w] = 1;
            since[w] = t;
            cpu0[w] = cpu;
          } else if (t - since[w] >= STALL) {
            stalled = (cpu - cpu0[w]) * 1e-9 < 0.5 * (t - since[w]);
            since[w] = t;
            cpu0[w] = cpu;
          }
        }
      }
      if (!late && !stalled) continue;
      char *scratch = malloc(chunk_bytes(j, k));
      if (!scratch) { j->error = 1; publish(j, k, NULL); continue; }
      run_chunk(j, k, scratch);
      STAT(3, 1);
      STAT(4, publish(j, k, scratch));
      STAT(late ? 7 : 6, 1);
      free(scratch);
      backups++;
    }
    if (late) break;
    if (!backups)
      for (int i = 0; i < 32; i++) __builtin_ia32_pause();
  }
  STAT(5, (long)((now() - t1) * 1e9));
  /* a worker may still be writing a chunk it claimed: wait until it is in (a short
   * copy; yield the core in case that worker waits for it) */
  for (int spins = 0; __atomic_load_n(&j->left, __ATOMIC_ACQUIRE) > 0; spins++) {
    if (spins < 1000)
      __builtin_ia32_pause();
    else
      sched_yield();
  }
  pthread_mutex_lock(&g_lock);
  if (g_job == j) g_job = NULL; /* late workers skip it */
  pthread_mutex_unlock(&g_lock);
}

static long *copy_args(long n, const long *args) {
  long *copy = malloc((n > 0 ? n : 1) * sizeof(long));
  if (copy && n > 0) memcpy(copy, args, n * sizeof(long));
  return copy;
}

/* C = A @ B on up to `threads` threads, then the epilogue `epi` (or NULL; its `nepi`
 * pointers `epi_args` are copied) per chunk and `fin` (its `nsum` column sums).
 * Returns 1 (done), the job handle while a late worker holds it (for
 * fflow_gemm_busy), or 0 with *error set. */
long fflow_gemm(int isz, int ta, int tb, long M, long N, long K, const void *A, long lda,
                const void *B, long ldb, void *C, long ldc, long nb0, long nb1, long sa0,
                long sa1, long sb0, long sb1, long sc0, long sc1, int threads, int *error,
                void *epi, void *fin, long nsum, long nepi, const long *epi_args) {
  job_t *j = calloc(1, sizeof(job_t));
  long *args = epi ? copy_args(nepi, epi_args) : NULL;
  if (!j || (epi && !args)) {
    free(j);
    free(args);
    *error = 1;
    return 0;
  }
  j->epi = (epi_t)epi;
  j->fin = (fin_t)fin;
  j->nsum = fin ? nsum : 0;
  j->epi_args = args;
  j->isz = isz; j->ta = ta; j->tb = tb;
  j->M = M; j->N = N; j->K = K; j->lda = lda; j->ldb = ldb; j->ldc = ldc;
  j->A = A; j->B = B; j->C = C;
  j->nb0 = nb0; j->nb1 = nb1;
  j->sa0 = sa0; j->sa1 = sa1; j->sb0 = sb0; j->sb1 = sb1; j->sc0 = sc0; j->sc1 = sc1;
  long nb = nb0 * nb1, extent, align = 16;
  /* one thread: one call, no wake-up. Two chunks per thread let a caller take the
   * chunks of a worker that woke late; in a quiet step the workers poll, kept off the
   * caller's CPU, and start at once: one chunk each repacks the shared operand half as
   * often (the MLP step 2-3 % faster, same process alternating per call) */
  int per = __atomic_load_n(&g_spin_ns, __ATOMIC_RELAXED) > 0 ? 1 : 2;
  int parts = threads > 1 ? per * threads : 1;
  if (nb >= 2) { j->axis = 0; extent = nb; align = 1; }
  else if (N >= M) { j->axis = 2; extent = N; }
  else { j->axis = 1; extent = M; }
  if (parts > MAXCH) parts = MAXCH;
  long step = (extent + parts - 1) / parts;
  step = (step + align - 1) / align * align;
  if (step < 1) step = 1;
  int n = 0;
  for (long s = 0; s < extent; s += step) j->bounds[n++] = s;
  j->bounds[n] = extent;
  j->n = j->left = n;
  j->refs = 1;
  j->max_workers = threads - 1;
  if (j->nsum) { /* column sums: one accumulator per row chunk, one for column chunks */
    j->acc = calloc((j->axis == 1 ? n : 1) * j->nsum * N, sizeof(double));
    if (!j->acc) {
      free(args);
      free(j);
      *error = 1;
      return 0;
    }
  }
  lead(j);
  finish(j);
  *error = j->error;
  return handle(j);
}

/* The pool's counters (g_stats) into out[0..NSTATS-1]. */
void fflow_pool_stats(long *out) {
  for (int i = 0; i < NSTATS; i++) out[i] = __atomic_load_n(&g_stats[i], __ATOMIC_RELAXED);
}

/* Whether a worker still holds the job (its operands must stay alive). */
int fflow_gemm_busy(long handle) {
  job_t *j = (job_t *)handle;
  pthread_mutex_lock(&j->lock);
  int busy = j->refs > 1;
  pthread_mutex_unlock(&j->lock);
  return busy;
}

void fflow_gemm_release(long handle) { release((job_t *)handle); }

/* CPU nanoseconds the workers spent on chunks so far (g_stats[8]). */
long fflow_pool_worker_ns(void) { return __atomic_load_n(&g_stats[8], __ATOMIC_RELAXED); }

/* Keep the workers off CPU `cpu` (the caller's) within the caller's affinity mask, or
 * let them run on any of its CPUs again (-1). Why: in a VM an idle vCPU looks
 * preempted to the scheduler, so a worker woken while the other cores sleep lands on
 * the waker's CPU; polling there, it held the caller off its core for the whole poll
 * window (36-50 % of wake-ups after 1-5 ms of idle took 0.5 ms instead of ~12 µs), and
 * a process whose worker shared the caller's core from its start ran the MLP step at
 * one thread's speed (2.4 ms against 1.4 ms) for its whole life. */
static void keep_off(int cpu) {
  if (cpu == g_kept_off) return;
  cpu_set_t mask;
  if (sched_getaffinity(0, sizeof mask, &mask) != 0) return;
  if (cpu >= 0) {
    if (!CPU_ISSET(cpu, &mask) || CPU_COUNT(&mask) < 2) return;
    CPU_CLR(cpu, &mask);
  }
  for (int w = 0; w < g_workers; w++) pthread_setaffinity_np(g_thread[w], sizeof mask, &mask);
  g_kept_off = cpu;
}

/* A step on the pool that does not poll (a busy machine: the other cores may be taken):
 * the workers may run on any of the caller's CPUs again. */
void fflow_pool_spread(void) { keep_off(-1); }

/* Worker w's thread id (0 before it started, -1 past the last worker). */
long fflow_pool_worker_tid(int w) {
  return w < g_workers ? __atomic_load_n(&g_tid[w], __ATOMIC_ACQUIRE) : -1;
}

/* A compiled step begins (spin > 0: its workers poll that long for each next job, and
 * the blocked ones wake now, while the caller still runs the step's first Python) or
 * ends (spin 0: every polling worker blocks; no thread spins between steps). */
void fflow_pool_step(double spin) {
  if (spin > 0) {
    keep_off(sched_getcpu());
    __atomic_store_n(&g_spin_ns, (long)(spin * 1e9), __ATOMIC_RELEASE);
    pthread_mutex_lock(&g_lock);
    g_job = NULL;
    __atomic_add_fetch(&g_gen, 1, __ATOMIC_ACQ_REL);
    pthread_cond_broadcast(&g_wake);
    pthread_mutex_unlock(&g_lock);
  } else {
    __atomic_store_n(&g_spin_ns, 0L, __ATOMIC_RELEASE);
    __atomic_add_fetch(&g_epoch, 1, __ATOMIC_ACQ_REL);
  }
}

/* out[s..e) = fn over chunks of 0..n on up to `threads` threads (see the header);
 * `args` (nargs pointers) are copied. Chunks start at multiples of `align` indices, so
 * a vectorized loop puts every index in the same lane position (vector body or tail)
 * on any thread count: the same bits. Returns the job handle, or 0 with *error set. */
long fflow_parallel(void *fn, long nargs, const long *args, void *out, long n, long unit,
                    long grain, long align, int threads, int *error) {
  job_t *j = calloc(1, sizeof(job_t));
  long *copy = malloc((nargs ? nargs : 1) * sizeof(long));
  if (!j || !copy) {
    free(j);
    free(copy);
    *error = 1;
    return 0;
  }
  memcpy(copy, args, nargs * sizeof(long));
  j->axis = 3;
  j->fn = (void (*)(long *, char *, long, long))fn;
  j->args = copy;
  j->unit = unit;
  j->C = out;
  long parts = n / (grain > 0 ? grain : 1);
  if (parts > MAXCH) parts = MAXCH;
  if (parts < 1) parts = 1;
  long step = (n + parts - 1) / parts;
  if (align > 1) step = (step + align - 1) / align * align;
  int c = 0;
  for (long s = 0; s < n; s += step) j->bounds[c++] = s;
  j->bounds[c] = n;
  j->n = j->left = c;
  j->refs = 1;
  j->max_workers = threads - 1;
  lead(j);
  *error = j->error;
  return handle(j);
}

/* Several independent GEMMs as the chunks of one job: each runs whole on one thread
 * (no re-packing of cut operands, one wake-up), the caller backing up late ones as
 * for chunks. desc: 17 longs per GEMM (isz, ta, tb, M, N, K, A, lda, B, ldb, C, ldc,
 * epilogue or 0, its sums' function or 0, its column sums, pointer count, pointers).
 * Returns the job handle, or 0 with *error set. */
long fflow_gemm_list(int count, const long *desc, int threads, int *error) {
  job_t *j = calloc(1, sizeof(job_t));
  job_t *list = calloc(count > 0 ? count : 1, sizeof(job_t));
  if (!j || !list || count > MAXCH) {
    free(j);
    free(list);
    *error = 1;
    return 0;
  }
  for (int k = 0; k < count; k++) {
    const long *d = desc + 17 * k;
    job_t *g = &list[k];
    if (d[12]) { /* its epilogue: function, sums' function, sums, pointer count, pointers */
      g->epi = (epi_t)d[12];
      g->fin = (fin_t)d[13];
      g->nsum = d[13] ? d[14] : 0;
      g->epi_args = copy_args(d[15], (const long *)d[16]);
      g->acc = g->nsum ? calloc(g->nsum * d[4], sizeof(double)) : NULL;
      if (!g->epi_args || (g->nsum && !g->acc)) { /* out of memory: no job */
        for (int q = 0; q <= k; q++) {
          free(list[q].epi_args);
          free(list[q].acc);
        }
        free(list);
        free(j);
        *error = 1;
        return 0;
      }
    }
    g->isz = (int)d[0]; g->ta = (int)d[1]; g->tb = (int)d[2];
    g->M = d[3]; g->N = d[4]; g->K = d[5];
    g->A = (const char *)d[6]; g->lda = d[7];
    g->B = (const char *)d[8]; g->ldb = d[9];
    g->C = (char *)d[10]; g->ldc = d[11];
    j->bounds[k] = k;
  }
  j->bounds[count] = count;
  j->axis = 4;
  j->list = list;
  j->n = j->left = count;
  j->refs = 1;
  j->max_workers = threads - 1;
  lead(j);
  finish(j);
  *error = j->error;
  return handle(j);
}
