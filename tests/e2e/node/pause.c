/* The pod sandbox's only process (what registry.k8s.io/pause does): hold the pod's namespaces
 * open, reap children re-parented to it, and exit on SIGINT/SIGTERM. Built static so the image
 * needs no libc (tests/e2e/node/build.sh). */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, 0, WNOHANG) > 0) {
  }
}

static void quit(int sig) {
  (void)sig;
  _exit(0);
}

int main(void) {
  struct sigaction chld = {0};
  chld.sa_handler = reap;
  chld.sa_flags = SA_NOCLDSTOP | SA_RESTART;
  sigaction(SIGCHLD, &chld, 0);
  signal(SIGINT, quit);
  signal(SIGTERM, quit);
  for (;;) pause();
}
