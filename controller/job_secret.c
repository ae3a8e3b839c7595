/* job_secret.c: a job's claim secret (job_secret.h), SHA-256 through
 * OpenSSL's libcrypto. */
#include "job_secret.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int job_secret(const struct job_member *m, int n, char out[JOB_SECRET_LEN + 1]) {
  static const char domain[] = "muster job secret v1\n";
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned mdlen = 0;
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  int ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1 &&
           EVP_DigestUpdate(ctx, domain, sizeof(domain) - 1) == 1;

  out[0] = '\0';
  for (int i = 0; ok && i < n; i++) {
    char attempt[24];
    int alen = snprintf(attempt, sizeof(attempt), "\n%d\n", m[i].attempt);

    /* (ids and tokens hold no newline: each field is delimited) */
    ok = EVP_DigestUpdate(ctx, m[i].id, strlen(m[i].id)) == 1 &&
         EVP_DigestUpdate(ctx, attempt, (size_t)alen) == 1 &&
         EVP_DigestUpdate(ctx, m[i].token, strlen(m[i].token)) == 1 &&
         EVP_DigestUpdate(ctx, "\n", 1) == 1;
  }
  ok = ok && EVP_DigestFinal_ex(ctx, md, &mdlen) == 1 && mdlen * 2 == JOB_SECRET_LEN;
  EVP_MD_CTX_free(ctx);
  if (!ok)
    return -1;
  for (unsigned i = 0; i < mdlen; i++)
    snprintf(out + 2 * i, 3, "%02x", md[i]);
  return 0;
}

/* The first nhex / 2 bytes of HMAC-SHA256(key, data) into out in hex,
 * data being what fmt formats (at most 255 bytes; wiped after). Returns 0,
 * or -1 with out empty. */
__attribute__((format(printf, 4, 5))) static int hmac_hex(const char *key, char *out, int nhex,
                                                          const char *fmt, ...) {
  unsigned char md[EVP_MAX_MD_SIZE];
  char data[256];
  unsigned mdlen = 0;
  va_list ap;
  int len, ok;

  va_start(ap, fmt);
  len = vsnprintf(data, sizeof(data), fmt, ap);
  va_end(ap);
  ok = len >= 0 && (size_t)len < sizeof(data) &&
       HMAC(EVP_sha256(), key, (int)strlen(key), (const unsigned char *)data, (size_t)len, md,
            &mdlen) &&
       mdlen >= (unsigned)nhex / 2;
  out[0] = '\0';
  for (int i = 0; ok && i < nhex / 2; i++)
    snprintf(out + 2 * i, 3, "%02x", md[i]);
  explicit_bzero(data, sizeof(data));
  explicit_bzero(md, sizeof(md));
  return ok ? 0 : -1;
}

int job_rotated_token(const char *key, const char *id, const char *old,
                      char out[ROTATED_TOKEN_LEN + 1]) {
  return hmac_hex(key, out, ROTATED_TOKEN_LEN, "muster rotated token v1\n%s\n%s", id, old);
}

int job_claimed_token(const char *key, const char *secret, const char *claim_key, const char *id,
                      int attempt, char out[CLAIMED_TOKEN_LEN + 1]) {
  return hmac_hex(key, out, CLAIMED_TOKEN_LEN, "muster claimed token v1\n%s\n%d\n%s\n%s", id,
                  attempt, secret, claim_key);
}

int run_token(const char *key, const char *run, char out[RUN_TOKEN_LEN + 1]) {
  memcpy(out, "mr_", 3);
  /* (as before: its data under 128 bytes) */
  if (strlen("muster run token v1\n") + strlen(run) >= 128 ||
      hmac_hex(key, out + 3, RUN_TOKEN_LEN - 3, "muster run token v1\n%s", run) != 0) {
    out[0] = '\0';
    return -1;
  }
  return 0;
}
