/*
 * backend.h: turns a scheduling worker into a running muster-workerd.
 *
 * Only the local backend exists so far: fork/exec on the controller's
 * host, one process group (session) per worker, each worker with its own
 * loopback address from 127.0.1.1 on. Called with the state lock held.
 */
#ifndef MUSTER_BACKEND_H
#define MUSTER_BACKEND_H

#include "state.h"

#include <stddef.h>

/* Prepares the backend (the environment handed to every workerd). */
int backend_init(void) __attribute__((warn_unused_result));
void backend_cleanup(void);

/* 1 if a worker of this size fits in what is free now. */
int backend_fits_locked(double cpu, double memory, int ngpu);

/* 0 if a worker of this size could fit an empty backend; otherwise
 * MUSTER_E_CAPACITY with *field set to the field that can never fit. */
int backend_could_ever_fit(double cpu, double memory, int ngpu, const char **field)
    __attribute__((warn_unused_result));

/* Reserves w's cores, memory, GPUs and an address, and starts its workerd.
 * On success w->pid is set and bind_ip / gpu_indices describe what it got.
 * On failure nothing stays reserved and err says why. */
int backend_start_locked(struct lw *w, char *bind_ip, size_t iplen, char *gpu_indices,
                         size_t gpulen, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/* Re-reserves what a worker left live by an earlier controller holds. */
void backend_adopt_locked(struct lw *w, const char *bind_ip, const char *gpu_indices);

/* Gives back w's cores, memory, GPUs and address. */
void backend_release_locked(struct lw *w);

/* Tells the backend that child pid was reaped. Returns 1 if it was the
 * backend's own (the fork server), 0 if it may be a worker. */
int backend_reaped_locked(pid_t pid);

/* Sends sig to w's process group (no-op without one). */
void backend_signal(pid_t pgid, int sig);

/* 1 if process pid exists. */
int backend_alive(pid_t pid);

#endif
