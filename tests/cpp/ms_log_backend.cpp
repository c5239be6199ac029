// A MindSpore-style plugin that logs at every level: INFO and DEBUG print only when OPBUILDER_VERBOSE is
// set; MS_LOG(EXCEPTION) (option raise="1") fails the build with its message.
#include "mindspore/include/custom_backend_api.h"

namespace mindspore {
namespace backend {

class LoggingBackend : public BackendBase {
 public:
  BackendGraphId Build(const FuncGraphPtr &func_graph, const BackendJitConfig &backend_jit_config) override {
    MS_LOG(INFO) << "info: " << func_graph->num_nodes() << " nodes";
    MS_LOG(DEBUG) << "debug: level " << backend_jit_config.jit_level();
    MS_LOG(ERROR) << "error: first node " << func_graph->node(0).op();
    if (backend_jit_config.Get("raise") == "1") MS_LOG(EXCEPTION) << "asked to fail, " << 42;
    return BackendManager::GetInstance().Build(func_graph, backend_jit_config).second;
  }
  RunningStatus Run(BackendGraphId graph_id, const VectorRef &inputs, VectorRef *outputs) override {
    return BackendManager::GetInstance().Run(kMSBackend, graph_id, inputs, outputs);
  }
};

MS_REGISTER_BACKEND("logging_backend", LoggingBackend)
}  // namespace backend
}  // namespace mindspore
