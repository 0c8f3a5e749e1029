/*
 * cpuid.h - which kernel sets this CPU and OS can run, decided once at start-up.
 *
 * An instruction set counts as present only when cpuid reports it and the OS saves its
 * register state (xgetbv), and for AMX when Linux grants the tile state to the process
 * (arch_prctl). CELER_CPU in the environment picks a set by name; nothing else reads it.
 */
#ifndef CELER_BACKEND_CPU_CPUID_H
#define CELER_BACKEND_CPU_CPUID_H

#include <stdbool.h>

typedef enum cpu_isa {
    CPU_ISA_REF,     /* scalar reference kernels (src/backend/ref), the oracle */
    CPU_ISA_GENERIC, /* the fast path's packed layout in plain C */
    CPU_ISA_AVX2,    /* AVX2 + FMA + F16C */
    CPU_ISA_AVX512,  /* AVX-512 F/BW/VL + VNNI */
    CPU_ISA_AMX,     /* AVX512 plus AMX-TILE/INT8/BF16 for prefill tiles */
    CPU_ISA_COUNT_
} cpu_isa;

const char *cpu_isa_name(cpu_isa isa);
/* Parses a kernel set name ("auto" gives the best supported); false when unknown. */
bool cpu_isa_from_name(const char *name, cpu_isa *out);
bool cpu_isa_supported(cpu_isa isa);
/* The fastest supported set. */
cpu_isa cpu_isa_best(void);
/* Physical cores (distinct core ids in sysfs), at least 1. */
int cpu_physical_cores(void);

#endif
