// Grows a std::vector past 1 GiB one element at a time, then checks every element.
#include <cstdint>
#include <cstdio>
#include <vector>

int main() {
    const size_t n = (1ull << 30) / 8 + 12345678;  // > 1 GiB of uint64_t
    std::vector<uint64_t> v;
    for (size_t i = 0; i < n; i++) v.push_back(i * 2654435761ull);
    for (size_t i = 0; i < n; i++)
        if (v[i] != i * 2654435761ull) {
            std::fprintf(stderr, "element %zu wrong\n", i);
            return 1;
        }
    std::printf("ok %zu bytes\n", v.size() * sizeof(uint64_t));
    return 0;
}
