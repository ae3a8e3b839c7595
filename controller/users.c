/* users.c: users' tokens and names (users.h). */
#include "users.h"

#include "muster_errors.h"
#include "util.h"

#include <openssl/evp.h>
#include <pwd.h>
#include <stdio.h>
#include <string.h>

/* The SHA-256 of s, in hex, into out (65 bytes). Returns 0 or -1. */
static int sha256_hex(const char *s, char *out) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;

  if (EVP_Digest(s, strlen(s), md, &n, EVP_sha256(), NULL) != 1 || n != 32)
    return -1;
  for (unsigned i = 0; i < n; i++)
    snprintf(out + 2 * i, 3, "%02x", md[i]);
  return 0;
}

int user_token_new(char *token, char *prefix, char *sha256) {
  char hex[65];

  if (util_random_hex(hex, 32) != 0)
    return MUSTER_E_IO;
  snprintf(token, USER_TOKEN_LEN + 1, USER_TOKEN_PREFIX "%s", hex);
  explicit_bzero(hex, sizeof(hex));
  return user_token_parts(token, prefix, sha256) ? 0 : MUSTER_E_IO;
}

int user_token_parts(const char *token, char *prefix, char *sha256) {
  size_t pl = strlen(USER_TOKEN_PREFIX);

  if (strlen(token) != USER_TOKEN_LEN || strncmp(token, USER_TOKEN_PREFIX, pl) != 0)
    return 0;
  for (const char *c = token + pl; *c; c++)
    if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f')))
      return 0;
  memcpy(prefix, token + pl, USER_PREFIX_LEN);
  prefix[USER_PREFIX_LEN] = '\0';
  return sha256_hex(token, sha256) == 0;
}

int user_unix_ok(const char *account, char *why, size_t whylen) {
  size_t n = strlen(account);
  struct passwd pwbuf, *pw = NULL;
  char buf[4096];

  /* (POSIX's portable names, as useradd takes them; '$' ends a Samba
   * machine account) */
  if (n == 0 || n >= sizeof(((struct db_user *)0)->unix_user) || account[0] == '-') {
    snprintf(why, whylen, "%s is not an account name", account);
    return -1;
  }
  for (const char *c = account; *c; c++)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
          *c == '_' || *c == '-' || *c == '.' || (*c == '$' && c[1] == '\0'))) {
      snprintf(why, whylen, "%s is not an account name", account);
      return -1;
    }
  (void)getpwnam_r(account, &pwbuf, buf, sizeof(buf), &pw); /* (API threads at once) */
  if (pw && (pw->pw_uid == 0 || pw->pw_gid == 0)) {
    snprintf(why, whylen, "%s is root or in root's group: a worker's code never runs so", account);
    return -1;
  }
  return 0;
}

int user_name_ok(const char *name) {
  return session_user_ok(name, strlen(name)) && strcmp(name, USER_BOOTSTRAP) != 0;
}
