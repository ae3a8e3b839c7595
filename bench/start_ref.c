/*
 * start_ref.c: bench/start's reference, a C program that does nothing,
 * linked with OpenBLAS and Open MPI as muster-train is: the start-up cost
 * any MPI + BLAS program pays (the loader, the libraries' constructors).
 * The calls below never run; they keep the linker from dropping either
 * library.
 */
#include <cblas.h>
#include <mpi.h>

int main(int argc, char **argv) {
  if (argc > 1000) {
    float a = 0;
    MPI_Init(&argc, &argv);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1, 1, 1, 1, &a, 1, &a, 1, 0, &a, 1);
    MPI_Finalize();
  }
  return 0;
}
