/*
 * cpuid.c - instruction-set detection (cpuid + xgetbv + Linux AMX permission) and the
 * physical core count. Results are computed once and cached.
 */
#define _GNU_SOURCE
#include "backend/cpu/cpuid.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define CPU_X86 1
#else
#define CPU_X86 0
#endif

static const char *const isa_names[CPU_ISA_COUNT_] = {"ref", "generic", "avx2", "avx512", "amx"};

const char *cpu_isa_name(cpu_isa isa) {
    return isa < CPU_ISA_COUNT_ ? isa_names[isa] : "?";
}

bool cpu_isa_from_name(const char *name, cpu_isa *out) {
    if (!strcmp(name, "auto")) {
        *out = cpu_isa_best();
        return true;
    }
    for (int i = 0; i < CPU_ISA_COUNT_; i++)
        if (!strcmp(name, isa_names[i])) {
            *out = (cpu_isa)i;
            return true;
        }
    return false;
}

#if CPU_X86
static unsigned long long xcr0(void) {
    unsigned eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((unsigned long long)edx << 32) | eax;
}

/* Linux hands out AMX tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM). */
static bool amx_permitted(void) {
#ifdef __linux__
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
    return false;
#endif
}
#endif

static int detected = -1; /* bitmask of supported isas */

static int detect(void) {
    int mask = 1 << CPU_ISA_REF | 1 << CPU_ISA_GENERIC;
#if CPU_X86
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return mask;
    const bool fma = c & (1u << 12), f16c = c & (1u << 29), osxsave = c & (1u << 27);
    if (!osxsave || __get_cpuid_max(0, NULL) < 7) return mask;
    const unsigned long long x = xcr0();
    if ((x & 0x6) != 0x6) return mask;
    __cpuid_count(7, 0, a, b, c, d);
    const bool avx2 = b & (1u << 5), avx512f = b & (1u << 16), avx512bw = b & (1u << 30),
               avx512vl = b & (1u << 31), vnni = c & (1u << 11);
    const bool amx_bf16 = d & (1u << 22), amx_tile = d & (1u << 24), amx_int8 = d & (1u << 25);
    if (avx2 && fma && f16c) mask |= 1 << CPU_ISA_AVX2;
    const bool zmm_state = (x & 0xe0) == 0xe0;
    if ((mask & 1 << CPU_ISA_AVX2) && zmm_state && avx512f && avx512bw && avx512vl && vnni)
        mask |= 1 << CPU_ISA_AVX512;
    const bool tile_state = (x & (3ull << 17)) == (3ull << 17);
    if ((mask & 1 << CPU_ISA_AVX512) && amx_tile && amx_int8 && amx_bf16 && tile_state &&
        amx_permitted())
        mask |= 1 << CPU_ISA_AMX;
#endif
    return mask;
}

bool cpu_isa_supported(cpu_isa isa) {
    if (detected < 0) detected = detect(); /* idempotent: a race computes the same mask */
    return isa < CPU_ISA_COUNT_ && (detected >> isa & 1);
}

cpu_isa cpu_isa_best(void) {
    for (int i = CPU_ISA_COUNT_ - 1; i > 0; i--)
        if (cpu_isa_supported((cpu_isa)i)) return (cpu_isa)i;
    return CPU_ISA_REF;
}

int cpu_physical_cores(void) {
    /* Distinct (package, core) pairs among the online CPUs' topology entries. */
    enum { MAX_CORES = 1024 };
    long seen[MAX_CORES];
    int n = 0;
    DIR *dir = opendir("/sys/devices/system/cpu");
    if (dir) {
        struct dirent *de;
        while ((de = readdir(dir)) && n < MAX_CORES) {
            int cpu;
            char tail;
            if (sscanf(de->d_name, "cpu%d%c", &cpu, &tail) != 1) continue;
            char path[256];
            long core = -1, pkg = 0;
            snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/core_id", cpu);
            FILE *f = fopen(path, "r");
            if (!f) continue;
            if (fscanf(f, "%ld", &core) != 1) core = -1;
            fclose(f);
            snprintf(path, sizeof path,
                     "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", cpu);
            if ((f = fopen(path, "r"))) {
                if (fscanf(f, "%ld", &pkg) != 1) pkg = 0;
                fclose(f);
            }
            if (core < 0) continue;
            const long key = pkg << 20 | core;
            bool dup = false;
            for (int i = 0; i < n && !dup; i++) dup = seen[i] == key;
            if (!dup) seen[n++] = key;
        }
        closedir(dir);
    }
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (n <= 0 || (online > 0 && n > online)) n = online > 0 ? (int)online : 1;
    return n;
}
