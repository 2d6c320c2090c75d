//! The benchmark's smoke tests, in one test binary: every scenario and every codec scenario
//! runs with tiny counts.

mod codecs_smoke;
mod smoke;
