#include <cstdio>
int main() { std::puts("nextn: under construction"); return 0; }
