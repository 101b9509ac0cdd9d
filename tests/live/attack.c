/* A container's view of the decider's socket, for the attack tests (tests/live/test_decider_attacks.py).
 *
 * Built static at test time (cc -static), so it runs in the busybox rootfs. Two modes:
 *   attack send SOCKET REQUEST   connect, send REQUEST's bytes with a pidfd of this process
 *                                (SCM_RIGHTS), print each frame the listener answers. A decline
 *                                naming "pidfd is process N" makes it patch the state's pid
 *                                field (the 10 characters after `"pid": `) to N and ask again;
 *                                a "ready" frame (R) gets a "go" (G).
 *   attack plant SOCKET ANSWER   bind a listener beside SOCKET, rename it over SOCKET, print
 *                                PLANTED, accept one connection, read what it sends, write
 *                                ANSWER's bytes, and read until the peer closes.
 * Output lines: FRAME <kind> <payload, non-printables as \xNN>, CLOSED, PLANTED, SERVED.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(2); }
    char *buf = malloc(1 << 22);
    *len = fread(buf, 1, 1 << 22, f);
    fclose(f);
    return buf;
}

static int dial(const char *path) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    strncpy(a.sun_path, path, sizeof a.sun_path - 1);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a) < 0) { printf("CONNECT %s\n", strerror(errno)); exit(3); }
    return s;
}

static int exactly(int s, char *buf, size_t n) {
    while (n) {
        ssize_t r = read(s, buf, n);
        if (r <= 0) return -1;
        buf += r; n -= (size_t)r;
    }
    return 0;
}

/* one frame; returns its kind, or 0 when the peer closed */
static char frame(int s, char *payload, size_t *len) {
    unsigned char head[5];
    if (exactly(s, (char *)head, 5) < 0) return 0;
    size_t n = ((size_t)head[1] << 24) | (head[2] << 16) | (head[3] << 8) | head[4];
    if (n > (1 << 20) || exactly(s, payload, n) < 0) return 0;
    *len = n;
    printf("FRAME %c ", head[0]);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)payload[i];
        if (c >= 32 && c < 127 && c != '\\') putchar(c); else printf("\\x%02x", c);
    }
    putchar('\n');
    fflush(stdout);
    return (char)head[0];
}

static void send_fd(int s, const char *buf, size_t len, int fd) {
    struct iovec io = {.iov_base = (void *)buf, .iov_len = len};
    char ctl[CMSG_SPACE(sizeof(int))];
    struct msghdr m = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET; c->cmsg_type = SCM_RIGHTS; c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof(int));
    ssize_t sent = sendmsg(s, &m, MSG_NOSIGNAL);
    if (sent > 0 && (size_t)sent < len) (void)!write(s, buf + sent, len - (size_t)sent);
}

static int do_send(const char *path, const char *reqfile) {
    size_t len, n;
    char *req = slurp(reqfile, &len);
    char *payload = malloc(1 << 20);
    int pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
    for (int round = 0; round < 3; round++) {
        int s = dial(path);
        send_fd(s, req, len, pidfd);
        char kind = frame(s, payload, &n);
        if (!kind) { printf("CLOSED\n"); return 0; }
        if (kind == 'R') {
            (void)!write(s, "G\0\0\0\0", 5);
            if (!frame(s, payload, &n)) printf("CLOSED\n");
            return 0;
        }
        payload[n < (1 << 20) ? n : (1 << 20) - 1] = 0;
        char *at = kind == 'D' ? strstr(payload, "pidfd is process ") : NULL;
        char *field = memmem(req, len, "\"pid\": ", 7);
        if (!at || !field) return 0;
        char digits[16];
        snprintf(digits, sizeof digits, "%-10ld", strtol(at + 17, NULL, 10));
        memcpy(field + 7, digits, 10);
        close(s);
    }
    return 0;
}

static int do_plant(const char *path, const char *answerfile) {
    size_t len;
    char *answer = slurp(answerfile, &len);
    char tmp[sizeof(((struct sockaddr_un *)0)->sun_path)];
    snprintf(tmp, sizeof tmp, "%s.planted", path);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    strncpy(a.sun_path, tmp, sizeof a.sun_path - 1);
    unlink(tmp);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) < 0 || listen(s, 4) < 0 || rename(tmp, path) < 0) {
        printf("PLANT %s\n", strerror(errno));
        return 3;
    }
    printf("PLANTED\n");
    fflush(stdout);
    int c = accept(s, NULL, NULL);
    char buf[65536];
    (void)!read(c, buf, sizeof buf); /* the request (its first bytes are enough) */
    (void)!write(c, answer, len);
    while (read(c, buf, sizeof buf) > 0) {}
    printf("SERVED\n");
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 4 && !strcmp(argv[1], "send")) return do_send(argv[2], argv[3]);
    if (argc == 4 && !strcmp(argv[1], "plant")) return do_plant(argv[2], argv[3]);
    fprintf(stderr, "usage: attack send SOCKET REQUEST | attack plant SOCKET ANSWER\n");
    return 2;
}
