/* tr_metrics.h: muster-train's metrics, posted to its run (docs/design.md,
 * "Metrics") when it runs under muster: loss, accuracy, samples/s and step
 * time of every rank every --metrics-every steps (0: about once a second),
 * at each epoch's end and at the last step. Outside a run (no
 * MUSTER_RUN_ID) each call does nothing. */
#ifndef MUSTER_TR_METRICS_H
#define MUSTER_TR_METRICS_H

/* Starts this process's logger; rank: the rank its points carry. */
void tr_metrics_open(long every, int rank);

/* After step (0-based) of steps_per_epoch: its loss and accuracy (of the
 * global batch), and samples, those this rank computed in it. last: the
 * last step of an epoch or of the training, always logged. */
void tr_metrics_step(long step, long steps_per_epoch, double loss, double accuracy, long samples,
                     int last);

/* One value at step (the epoch's test accuracy, say). */
void tr_metrics_value(long step, long steps_per_epoch, const char *name, double value);

/* Sends what is left (at most 5 s) and stops the logger. */
void tr_metrics_close(void);

#endif
