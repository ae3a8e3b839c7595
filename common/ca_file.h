/*
 * ca_file.h: the certificate authorities a client trusts for the
 * controller's HTTPS (--tls-cert): the system's, or MUSTER_CA_FILE's (a
 * PEM file) where it is set. libcurl verifies the peer and its name by
 * default; this only names the file. The controller hands its own
 * MUSTER_CA_FILE on to its workers (common/envlists.h). Header only: the
 * C library and the CLI use it (workerd reads the same variable in
 * workerd/http_client.c).
 */
#ifndef MUSTER_CA_FILE_H
#define MUSTER_CA_FILE_H

#include <curl/curl.h>
#include <stdlib.h>

static inline void muster_curl_ca(CURL *curl) {
  const char *file = getenv("MUSTER_CA_FILE");

  if (file && *file)
    curl_easy_setopt(curl, CURLOPT_CAINFO, file);
}

#endif
