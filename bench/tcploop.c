/* Ping-pong on one TCP loopback connection, timed: the per-syscall cost of the HTTP capture.
 *
 *   tcploop ITERATIONS SIZE early|late
 *
 * Prints its pid, waits for a line on stdin, then runs ITERATIONS rounds of: the accepted
 * (server) side writes SIZE bytes, the client reads them, the client writes SIZE bytes, the
 * server reads them (4 syscalls, 2 of them on the accepted fd), and prints ns per round.
 * `late`: the connection is accepted after the go line (so a capture in scope tracks it);
 * `early`: before the pid is printed (in scope, but never tracked).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int listener, client, server;

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static void connect_pair(void)
{
	struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(addr);
	int one = 1;
	listener = socket(AF_INET, SOCK_STREAM, 0);
	if (listener < 0 || bind(listener, (struct sockaddr *)&addr, sizeof(addr)) ||
	    listen(listener, 1) || getsockname(listener, (struct sockaddr *)&addr, &len))
		die("listen");
	client = socket(AF_INET, SOCK_STREAM, 0);
	if (client < 0 || connect(client, (struct sockaddr *)&addr, sizeof(addr)))
		die("connect");
	server = accept4(listener, (struct sockaddr *)&addr, &len, 0);
	if (server < 0)
		die("accept");
	setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	setsockopt(server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static void read_full(int fd, char *buf, long size)
{
	for (long got = 0; got < size;) {
		long n = read(fd, buf + got, size - got);
		if (n <= 0)
			die("read");
		got += n;
	}
}

int main(int argc, char **argv)
{
	if (argc != 4)
		return 2;
	long iterations = atol(argv[1]);
	long size = atol(argv[2]);
	int early = strcmp(argv[3], "early") == 0;
	if (iterations <= 0 || size <= 0 || size > (1 << 20))
		return 2;
	char *out = malloc(size), *in = malloc(size), line[16];
	memset(out, 'x', size);
	if (early)
		connect_pair();
	printf("%d\n", getpid());
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin))
		return 1;
	if (!early)
		connect_pair();
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (long i = 0; i < iterations; i++) {
		if (write(server, out, size) != size)
			die("write");
		read_full(client, in, size);
		if (write(client, out, size) != size)
			die("write");
		read_full(server, in, size);
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double ns = (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
	printf("%.1f\n", ns / iterations);
	close(server);
	close(client);
	close(listener);
	return 0;
}
