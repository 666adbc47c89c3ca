#include "coordinator/cli.h"

int main(int argc, char** argv) { return kvmesh::coordinator::CliMain(argc, argv); }
