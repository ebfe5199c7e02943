/* gpuflight simulated GPU: what the driver's parts share. */
#ifndef GF_SIMGPU_H
#define GF_SIMGPU_H

/* Copy directions, as counted and as timed. */
enum { SIM_H2D = 0, SIM_D2H = 1, SIM_D2D = 2, SIM_H2H = 3, SIM_PEER = 4, SIM_DIR_COUNT = 5 };

/* Upper bound on generated stubs (driver_stubs.c indexes its names by id). */
#define SIM_MAX_STUBS 4096

/* Called by each generated stub with its own id. */
void sim_stub_hit(unsigned int id);

#endif
