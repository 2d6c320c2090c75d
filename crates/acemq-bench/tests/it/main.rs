//! The benchmark's smoke tests, in one test binary: every scenario and every codec scenario
//! runs with tiny counts, and so does the floor of scenario 5.

mod codecs_smoke;
mod floor_smoke;
mod smoke;
