/* The argmax of a row of floats, one definition for the CPU backend's argmax op and the
 * sampler's greedy draw (the CUDA backend's kernel follows it too). */
#ifndef TS_BASE_ARGMAX_H
#define TS_BASE_ARGMAX_H

/* The first index of the largest of v[0..n), NaN never taken; 0 for a row of NaN alone (or
 * n <= 0). */
int ts_argmax_f32(const float *v, int n);
/* The largest of v[0..n), NaN never taken; -INFINITY for a row of NaN alone (or n <= 0). */
float ts_max_f32(const float *v, int n);

#endif
