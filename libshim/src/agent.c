/* libtgs.so: the connection to tgsd (the container's socket), kept by one background
 * thread per process, started at the first CUDA call. It says hello, resends what the
 * process holds after every (re)connection, carries out eviction and restore orders,
 * and reconnects with backoff when tgsd goes away (one warning per outage). Notices
 * from application threads are written by those threads under one lock. */
#define _GNU_SOURCE
#include "tgs.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t g_send_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_fd = -1;         /* the published connection (under g_send_lock) */
static int g_started;         /* the agent thread exists */
static pthread_mutex_t g_hello_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_hello_cond = PTHREAD_COND_INITIALIZER;
static int g_first_try_done;  /* the first connection attempt is over, either way */
static int g_leaving;         /* the process is exiting and said bye: tgsd closes, as it should */
#define FIRST_HELLO_WAIT_MS 100 /* the first CUDA call waits this long at most for tgsd */
static uint32_t g_seq;

#define BACKOFF_MIN_NS 100000000ull
#define BACKOFF_MAX_NS 5000000000ull
#define REPLY_TIMEOUT_MS 2000

void tgs_msg_init(struct tgs_msg_header *h, uint16_t type, uint32_t size) {
    h->magic = TGS_MSG_MAGIC;
    h->type = type;
    h->version = TGS_PROTO_VERSION;
    h->size = size;
    h->seq = __atomic_add_fetch(&g_seq, 1, __ATOMIC_RELAXED);
}

static int write_frame(int fd, const void *msg, uint32_t size) {
    unsigned char buf[4 + 256];
    if (size > sizeof buf - 4)
        return -1;
    buf[0] = (unsigned char)size;
    buf[1] = (unsigned char)(size >> 8);
    buf[2] = (unsigned char)(size >> 16);
    buf[3] = (unsigned char)(size >> 24);
    memcpy(buf + 4, msg, size);
    size_t done = 0, n = 4 + size;
    while (done < n) {
        ssize_t w = send(fd, buf + done, n - done, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        done += (size_t)w;
    }
    return 0;
}

void tgs_agent_send(const void *msg, uint32_t size) {
    pthread_mutex_lock(&g_send_lock);
    if (g_fd >= 0 && write_frame(g_fd, msg, size) < 0)
        shutdown(g_fd, SHUT_RDWR); /* the agent sees it and reconnects */
    pthread_mutex_unlock(&g_send_lock);
}

/* Reads exactly n bytes within timeout_ms: 1, 0 on EOF or timeout, -1 on error. */
static int read_full(int fd, void *buf, size_t n, int timeout_ms) {
    size_t done = 0;
    uint64_t deadline = tgs_now() + (uint64_t)timeout_ms * 1000000ull;
    while (done < n) {
        uint64_t now = tgs_now();
        if (now >= deadline)
            return 0;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, (int)((deadline - now) / 1000000ull) + 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return r;
        ssize_t got = recv(fd, (char *)buf + done, n - done, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return got == 0 ? 0 : -1;
        done += (size_t)got;
    }
    return 1;
}

enum frame_result { FRAME_OK = 1, FRAME_GONE = 0, FRAME_GARBAGE = -1 };

/* One frame into buf (at most cap bytes, which is larger than any message tgsd sends). */
static int read_frame(int fd, void *buf, size_t cap, uint32_t *size, char *why, size_t why_len) {
    unsigned char len[4];
    int r = read_full(fd, len, 4, REPLY_TIMEOUT_MS);
    if (r <= 0)
        return FRAME_GONE;
    uint32_t n = (uint32_t)len[0] | (uint32_t)len[1] << 8 | (uint32_t)len[2] << 16 | (uint32_t)len[3] << 24;
    if (n < sizeof(struct tgs_msg_header) || n > TGS_MAX_FRAME || n > cap) {
        snprintf(why, why_len, "a frame of %u bytes", n);
        return FRAME_GARBAGE;
    }
    if (read_full(fd, buf, n, REPLY_TIMEOUT_MS) <= 0)
        return FRAME_GONE;
    const struct tgs_msg_header *h = buf;
    if (h->magic != TGS_MSG_MAGIC || h->version != TGS_PROTO_VERSION || h->size != n) {
        snprintf(why, why_len, "a malformed message (magic %#x, version %u, size %u of %u)", h->magic, h->version,
                 h->size, n);
        return FRAME_GARBAGE;
    }
    *size = n;
    return FRAME_OK;
}

static int connect_daemon(char *why, size_t why_len) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    int n = snprintf(a.sun_path, sizeof a.sun_path, "%s/%s", g_tgs.dir, TGS_SOCKET_NAME);
    if (n >= (int)sizeof a.sun_path) {
        snprintf(why, why_len, "the socket path %s/%s is too long", g_tgs.dir, TGS_SOCKET_NAME);
        return -1;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        snprintf(why, why_len, "%s: %s", a.sun_path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

static void read_comm(char out[16]) {
    memset(out, 0, 16);
    int fd = open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t n = read(fd, out, 15);
    close(fd);
    for (ssize_t i = 0; i < n; i++)
        if (out[i] == '\n')
            out[i] = 0;
}

/* Hello and its acknowledgement. Returns FRAME_OK, FRAME_GONE or FRAME_GARBAGE. */
static int hello(int fd, char *why, size_t why_len) {
    struct tgs_msg_hello m;
    memset(&m, 0, sizeof m);
    tgs_msg_init(&m.h, TGS_MSG_HELLO, sizeof m);
    m.pid = (uint32_t)getpid();
    m.cuda_version = __atomic_load_n(&g_tgs.cuda_version, __ATOMIC_RELAXED);
    int v = 0;
    if (real_cuDriverGetVersion && real_cuDriverGetVersion(&v) == CUDA_SUCCESS)
        m.driver_version = (uint32_t)v;
    m.activity_slot = __atomic_load_n(&g_tgs.activity_slot, __ATOMIC_RELAXED);
    read_comm(m.comm);
    if (write_frame(fd, &m, sizeof m) < 0)
        return FRAME_GONE;
    union {
        struct tgs_msg_hello_ack ack;
        unsigned char raw[512];
    } u;
    uint32_t size;
    int r = read_frame(fd, &u, sizeof u, &size, why, why_len);
    if (r != FRAME_OK)
        return r;
    if (u.ack.h.type != TGS_MSG_HELLO_ACK || size != sizeof u.ack) {
        snprintf(why, why_len, "message type %u (%u bytes) instead of a hello acknowledgement", u.ack.h.type, size);
        return FRAME_GARBAGE;
    }
    if (u.ack.status != 0)
        tgs_log(TGS_LOG_WARN, "tgsd refused this process (status %u): it runs at the floor rate", u.ack.status);
    uint32_t old = __atomic_exchange_n(&g_tgs.activity_slot, u.ack.activity_slot, __ATOMIC_RELAXED);
    if (old != u.ack.activity_slot && old < TGS_ACTIVITY_SLOTS) {
        for (unsigned i = 0; i < TGS_MAX_GPUS; i++) { /* the old byte is no longer ours */
            struct tgs_gpu *g = &g_tgs.gpu[i];
            if (g->activity_rw)
                g->activity_rw[old] = 0;
            g->busy_marked = 0;
        }
    }
    return FRAME_OK;
}

static void serve(int fd) {
    char why[200];
    for (;;) {
        if (__atomic_load_n(&g_tgs.mode, __ATOMIC_RELAXED) != TGS_MODE_ACTIVE)
            return;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, 500);
        if (r < 0 && errno == EINTR)
            continue;
        if (r == 0)
            continue;
        union {
            struct tgs_msg_order order;
            unsigned char raw[512];
        } u;
        uint32_t size;
        int f = r > 0 ? read_frame(fd, &u, sizeof u, &size, why, sizeof why) : FRAME_GONE;
        if (f == FRAME_GONE)
            return;
        if (f == FRAME_OK && (u.order.h.type != TGS_MSG_ORDER || size != sizeof u.order)) {
            snprintf(why, sizeof why, "message type %u (%u bytes) where an order was expected", u.order.h.type, size);
            f = FRAME_GARBAGE;
        }
        if (f == FRAME_GARBAGE) {
            char msg[300];
            snprintf(msg, sizeof msg, "tgsd sent %s", why);
            tgs_fall_back(msg);
            return;
        }
        struct tgs_msg_order_ack ack;
        memset(&ack, 0, sizeof ack);
        tgs_msg_init(&ack.h, TGS_MSG_ORDER_ACK, sizeof ack);
        ack.op = u.order.op;
        ack.order_id = u.order.order_id;
        ack.status = (uint32_t)tgs_memory_order(&u.order, &ack.bytes);
        tgs_agent_send(&ack, sizeof ack);
    }
}

static void first_try_done(void) {
    pthread_mutex_lock(&g_hello_lock);
    g_first_try_done = 1;
    pthread_cond_broadcast(&g_hello_cond);
    pthread_mutex_unlock(&g_hello_lock);
}

static void *agent_main(void *arg) {
    (void)arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, NULL); /* signals are the application's */
    uint64_t backoff = BACKOFF_MIN_NS;
    int out = 0, ever = 0;
    char why[700];
    while (__atomic_load_n(&g_tgs.mode, __ATOMIC_RELAXED) == TGS_MODE_ACTIVE) {
        int fd = connect_daemon(why, sizeof why);
        int h = FRAME_GONE;
        if (fd >= 0) {
            h = hello(fd, why, sizeof why);
            if (h == FRAME_GONE)
                snprintf(why, sizeof why, "no acknowledgement to hello");
        }
        if (h == FRAME_GARBAGE) {
            char msg[800];
            snprintf(msg, sizeof msg, "tgsd sent %s", why);
            close(fd);
            tgs_fall_back(msg);
            first_try_done();
            break;
        }
        if (h != FRAME_OK) {
            first_try_done();
            if (fd >= 0)
                close(fd);
            if (!out)
                tgs_log(TGS_LOG_WARN,
                        "tgsd is not reachable (%s): production runs unthrottled, opportunistic work slides to "
                        "its floor; retrying",
                        why);
            out = 1;
            tgs_sleep_until(tgs_now() + backoff);
            backoff = backoff * 2 > BACKOFF_MAX_NS ? BACKOFF_MAX_NS : backoff * 2;
            continue;
        }
        if (out || ever)
            tgs_log(TGS_LOG_INFO, "connected to tgsd again");
        out = 0;
        ever = 1;
        backoff = BACKOFF_MIN_NS;
        pthread_mutex_lock(&g_send_lock);
        g_fd = fd;
        pthread_mutex_unlock(&g_send_lock);
        tgs_memory_resend();
        first_try_done();
        serve(fd);
        pthread_mutex_lock(&g_send_lock);
        g_fd = -1;
        pthread_mutex_unlock(&g_send_lock);
        close(fd);
        if (__atomic_load_n(&g_leaving, __ATOMIC_ACQUIRE))
            break;
        if (__atomic_load_n(&g_tgs.mode, __ATOMIC_RELAXED) == TGS_MODE_ACTIVE) {
            snprintf(why, sizeof why, "the connection closed");
            tgs_log(TGS_LOG_WARN, "lost tgsd (%s): production runs unthrottled, opportunistic work slides to its "
                                  "floor; reconnecting", why);
            out = 1;
        }
    }
    return NULL;
}

void tgs_agent_start(void) {
    if (likely(__atomic_load_n(&g_started, __ATOMIC_ACQUIRE)))
        return;
    int expected = 0;
    if (!__atomic_compare_exchange_n(&g_started, &expected, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return;
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    int r = pthread_create(&t, &a, agent_main, NULL);
    pthread_attr_destroy(&a);
    if (r != 0) {
        tgs_log(TGS_LOG_WARN, "cannot start the connection to tgsd (%s): budgets come from the control block alone",
                strerror(r));
        return;
    }
    /* The first CUDA call lets the hello finish (production needs its activity slot before
     * its first kernel), but waits no longer than this for a daemon that does not answer. */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += FIRST_HELLO_WAIT_MS * 1000000L;
    until.tv_sec += until.tv_nsec / 1000000000L;
    until.tv_nsec %= 1000000000L;
    pthread_mutex_lock(&g_hello_lock);
    while (!g_first_try_done)
        if (pthread_cond_timedwait(&g_hello_cond, &g_hello_lock, &until) != 0)
            break;
    pthread_mutex_unlock(&g_hello_lock);
}

void tgs_agent_after_fork(void) {
    if (g_fd >= 0)
        close(g_fd);
    g_fd = -1;
    pthread_mutex_init(&g_send_lock, NULL);
    pthread_mutex_init(&g_hello_lock, NULL);
    pthread_cond_init(&g_hello_cond, NULL);
    g_first_try_done = 0;
    __atomic_store_n(&g_started, 0, __ATOMIC_RELEASE);
}

__attribute__((destructor)) static void say_bye(void) {
    if (__atomic_load_n(&g_tgs.mode, __ATOMIC_RELAXED) != TGS_MODE_ACTIVE)
        return;
    for (unsigned i = 0; i < TGS_MAX_GPUS; i++)
        if (g_tgs.gpu[i].budget)
            tgs_production_idle(&g_tgs.gpu[i]);
    if (pthread_mutex_trylock(&g_send_lock) != 0)
        return;
    if (g_fd >= 0) {
        struct tgs_msg_bye m;
        tgs_msg_init(&m.h, TGS_MSG_BYE, sizeof m);
        /* tgsd answers bye by closing: the connection thread, still running while the
         * process exits, must not take that for tgsd lost (a warning after every job) */
        __atomic_store_n(&g_leaving, 1, __ATOMIC_RELEASE);
        write_frame(g_fd, &m, sizeof m);
    }
    pthread_mutex_unlock(&g_send_lock);
}
