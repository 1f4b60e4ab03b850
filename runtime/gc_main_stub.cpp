// The standalone binary's entry point: everything else is in the generated program's object file.
extern "C" int gc_main(int argc, char** argv);
int main(int argc, char** argv) { return gc_main(argc, argv); }
