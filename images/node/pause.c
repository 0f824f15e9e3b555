/* The pod sandbox ("pause") process: holds a pod's namespaces and reaps orphans until it is
   told to stop. Built static, shipped in the node image, so that no registry is needed. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, NULL, WNOHANG) > 0) {} }

int main(void) {
  struct sigaction a = {0};
  a.sa_handler = stop;
  sigaction(SIGINT, &a, NULL);
  sigaction(SIGTERM, &a, NULL);
  a.sa_handler = reap;
  a.sa_flags = SA_NOCLDSTOP;
  sigaction(SIGCHLD, &a, NULL);
  for (;;) pause();
  return 0;
}
