/* job_secret.c: a job's claim secret (job_secret.h), SHA-256 through
 * OpenSSL's libcrypto. */
#include "job_secret.h"

#include <openssl/evp.h>
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
