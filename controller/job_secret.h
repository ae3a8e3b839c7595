/* job_secret.h: the one secret a queueing backend's job carries (Slurm's:
 * in its environment, which every step of the job can read), with which
 * its launcher claims its workers' tokens (POST
 * /api/v1/workers/{id}/claim, api_claim.c).
 *
 * It is a digest of the workers' ids, attempts and current tokens: the
 * controller keeps nothing more (a restarted controller checks it from the
 * database), it reveals no token, and a claim mints new tokens, so the
 * secret is dead once claimed. */
#ifndef MUSTER_JOB_SECRET_H
#define MUSTER_JOB_SECRET_H

#define JOB_SECRET_LEN 64 /* hex digits */

/* One worker of a job. */
struct job_member {
  const char *id;
  int attempt;
  const char *token;
};

/* The secret of the job of workers m[0..n-1] (in the job's order) into out,
 * JOB_SECRET_LEN hex digits and a NUL. Returns 0, or -1 when the digest
 * could not be computed (out is then empty). */
int job_secret(const struct job_member *m, int n, char out[JOB_SECRET_LEN + 1])
    __attribute__((warn_unused_result));

#endif
