// `kvmesh client ACTION ...`: the cluster RPC API from the command line (server/rpc_client.h).
#pragma once

namespace kvmesh::coordinator {

int Client(int argc, char** argv);

}  // namespace kvmesh::coordinator
