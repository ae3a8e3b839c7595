/* job_secret.h: the secrets derived from the controller's key. First, the
 * one secret a queueing backend's job carries (Slurm's:
 * in its environment, which every step of the job can read), with which
 * its launcher claims its workers' tokens (POST
 * /api/v1/workers/{id}/claim, api_claim.c).
 *
 * It is a digest of the workers' ids, attempts and current tokens: the
 * controller keeps nothing more (a restarted controller checks it from the
 * database), it reveals no token, and a claim mints new tokens (derived
 * from it and the launcher's own claim key: job_claimed_token), so the
 * secret no longer matches them once claimed: it is good only for the
 * same claim again, with the same key, whose answer was lost, until a
 * register trades the token of a worker it names that is still live. */
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

/* The token a register that asks for a new one (rotate) gives worker id
 * whose token was old: an HMAC-SHA256 of both under key (the controller's
 * API token, kept in its state directory), its first 24 bytes in hex, so
 * that a restarted controller still recognises old as the token that
 * register traded (its retry is answered; another's is an intruder).
 * Returns 0, or -1 (out is then empty). */
#define ROTATED_TOKEN_LEN 48
int job_rotated_token(const char *key, const char *id, const char *old,
                      char out[ROTATED_TOKEN_LEN + 1]) __attribute__((warn_unused_result));

/* The token a job's claim (api_claim.c) gives worker id of attempt
 * attempt, claimed with secret and claim_key (picked at random by the
 * job's launcher, kept in its memory, sent with each try; "" from a
 * launcher that sends none): an HMAC-SHA256 of them under key (the
 * controller's API token), its first 24 bytes in hex. Derived, so that a
 * claim whose answer was lost can be made again, of a restarted
 * controller too, and get the same tokens, with the same key only, and
 * until the first of them is traded by its worker's register
 * (job_rotated_token). Returns 0, or -1 (out is then empty). */
#define CLAIMED_TOKEN_LEN 48
int job_claimed_token(const char *key, const char *secret, const char *claim_key, const char *id,
                      int attempt, char out[CLAIMED_TOKEN_LEN + 1])
    __attribute__((warn_unused_result));

/* The token of run's processes (MUSTER_RUN_TOKEN), which posts the run's
 * metrics: "mr_" and an HMAC-SHA256 of the run's id under key (the
 * controller's API token), its first 24 bytes in hex. Derived, never
 * stored: a restarted controller knows it as well. Returns 0, or -1 (out
 * is then empty). */
#define RUN_TOKEN_LEN 51
int run_token(const char *key, const char *run, char out[RUN_TOKEN_LEN + 1])
    __attribute__((warn_unused_result));

#endif
