/*
 * driver_floor: what a process pays the CUDA driver before any foldprint
 * code runs: loading libcuda, cuInit, cuDeviceGet, and the device's primary
 * context (cuDevicePrimaryCtxRetain + cuCtxSetCurrent, what the backend's
 * context creation does), then a first allocation and a synchronize in case
 * the driver defers work to them. One line of milliseconds on stdout.
 *
 * Build (needs only gcc and the C library; no CUDA headers or toolkit):
 *
 *     gcc -O2 -o target/driver_floor bench/driver_floor.c -ldl
 *
 * Run: target/driver_floor [ORDINAL]   (device 0 by default)
 *
 * The driver is opened as "libcuda.so.1" through the dynamic loader, so it
 * must be on the loader's path (LD_LIBRARY_PATH where it is not in the
 * loader cache). Exit status: 0 measured; 2 bad usage; 3 the driver library
 * or one of its functions is missing, or a driver call failed (its CUresult
 * is printed, with the driver's name and text for it when it has them).
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* The few driver API types used, declared here instead of cuda.h. */
typedef int CUresult; /* 0 is CUDA_SUCCESS */
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

typedef CUresult (*cuInit_t)(unsigned int flags);
typedef CUresult (*cuDriverGetVersion_t)(int *version);
typedef CUresult (*cuDeviceGet_t)(CUdevice *dev, int ordinal);
typedef CUresult (*cuDevicePrimaryCtxRetain_t)(CUcontext *ctx, CUdevice dev);
typedef CUresult (*cuDevicePrimaryCtxRelease_t)(CUdevice dev);
typedef CUresult (*cuCtxSetCurrent_t)(CUcontext ctx);
typedef CUresult (*cuCtxSynchronize_t)(void);
typedef CUresult (*cuMemAlloc_t)(CUdeviceptr *ptr, size_t bytes);
typedef CUresult (*cuMemFree_t)(CUdeviceptr ptr);
typedef CUresult (*cuGetErrorName_t)(CUresult r, const char **name);
typedef CUresult (*cuGetErrorString_t)(CUresult r, const char **text);

static cuGetErrorName_t get_error_name;
static cuGetErrorString_t get_error_string;

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static void *symbol(void *lib, const char *name)
{
    void *f = dlsym(lib, name);
    if (f == NULL) {
        fprintf(stderr, "driver_floor: libcuda.so.1 lacks %s\n", name);
        exit(3);
    }
    return f;
}

/* Stop with the call's CUresult (and the driver's words for it). */
static void check(CUresult r, const char *call)
{
    const char *name = NULL;
    const char *text = NULL;
    if (r == 0) {
        return;
    }
    if (get_error_name == NULL || get_error_name(r, &name) != 0) {
        name = NULL;
    }
    if (get_error_string == NULL || get_error_string(r, &text) != 0) {
        text = NULL;
    }
    fprintf(stderr, "driver_floor: %s failed: CUresult %d (%s: %s)\n", call, r,
            name != NULL ? name : "no name", text != NULL ? text : "no text");
    exit(3);
}

int main(int argc, char **argv)
{
    int ordinal = 0;
    if (argc > 2) {
        fprintf(stderr, "usage: %s [ORDINAL]\n", argv[0]);
        return 2;
    }
    if (argc == 2) {
        char *end = NULL;
        long v = strtol(argv[1], &end, 10);
        if (end == argv[1] || *end != '\0' || v < 0 || v > 1024) {
            fprintf(stderr, "driver_floor: ORDINAL must be a device number 0..1024, not \"%s\"\n",
                    argv[1]);
            return 2;
        }
        ordinal = (int)v;
    }

    double t0 = now_ms();
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (lib == NULL) {
        const char *why = dlerror();
        fprintf(stderr,
                "driver_floor: cannot load the CUDA driver library libcuda.so.1 (%s); "
                "is there an NVIDIA driver, and is its directory on LD_LIBRARY_PATH?\n",
                why != NULL ? why : "no loader message");
        return 3;
    }
    double t_dlopen = now_ms() - t0;

    /* Function pointers come back as void *; POSIX guarantees the cast. */
    get_error_name = (cuGetErrorName_t)symbol(lib, "cuGetErrorName");
    get_error_string = (cuGetErrorString_t)symbol(lib, "cuGetErrorString");
    cuInit_t cu_init = (cuInit_t)symbol(lib, "cuInit");
    cuDriverGetVersion_t driver_version = (cuDriverGetVersion_t)symbol(lib, "cuDriverGetVersion");
    cuDeviceGet_t device_get = (cuDeviceGet_t)symbol(lib, "cuDeviceGet");
    cuDevicePrimaryCtxRetain_t retain =
        (cuDevicePrimaryCtxRetain_t)symbol(lib, "cuDevicePrimaryCtxRetain");
    cuDevicePrimaryCtxRelease_t release =
        (cuDevicePrimaryCtxRelease_t)symbol(lib, "cuDevicePrimaryCtxRelease_v2");
    cuCtxSetCurrent_t set_current = (cuCtxSetCurrent_t)symbol(lib, "cuCtxSetCurrent");
    cuCtxSynchronize_t synchronize = (cuCtxSynchronize_t)symbol(lib, "cuCtxSynchronize");
    cuMemAlloc_t mem_alloc = (cuMemAlloc_t)symbol(lib, "cuMemAlloc_v2");
    cuMemFree_t mem_free = (cuMemFree_t)symbol(lib, "cuMemFree_v2");

    double t = now_ms();
    check(cu_init(0), "cuInit");
    double t_init = now_ms() - t;

    int version = 0;
    check(driver_version(&version), "cuDriverGetVersion");

    CUdevice dev = 0;
    t = now_ms();
    check(device_get(&dev, ordinal), "cuDeviceGet");
    double t_get = now_ms() - t;

    CUcontext ctx = NULL;
    t = now_ms();
    check(retain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    double t_retain = now_ms() - t;

    t = now_ms();
    check(set_current(ctx), "cuCtxSetCurrent");
    double t_current = now_ms() - t;

    CUdeviceptr p = 0;
    t = now_ms();
    check(mem_alloc(&p, 256), "cuMemAlloc_v2");
    double t_alloc = now_ms() - t;

    t = now_ms();
    check(synchronize(), "cuCtxSynchronize");
    double t_sync = now_ms() - t;
    double total = now_ms() - t0;

    check(mem_free(p), "cuMemFree_v2");
    check(release(dev), "cuDevicePrimaryCtxRelease_v2");

    printf("driver_floor: driver %d.%d, device %d: dlopen %.2f ms, cuInit %.2f ms, "
           "cuDeviceGet %.3f ms, cuDevicePrimaryCtxRetain %.2f ms, cuCtxSetCurrent %.3f ms, "
           "first cuMemAlloc %.3f ms, cuCtxSynchronize %.3f ms, total %.2f ms\n",
           version / 1000, (version % 1000) / 10, ordinal, t_dlopen, t_init, t_get, t_retain,
           t_current, t_alloc, t_sync, total);
    return 0;
}
