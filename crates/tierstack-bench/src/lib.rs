pub fn placeholder_bench() {}
