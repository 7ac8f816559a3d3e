// The libtorch peer of bench/bench_gpt_e2e.cpp: the same GPT-2 (pre-LN blocks, tanh GELU, learned
// positions, head tied to wte, causal attention), the same random tokens per B/T, AdamW with the same two
// decay groups (weight decay on rank >= 2 parameters only), and the same step loop:
//   loss = cross_entropy(model(idx), targets); loss.backward(); opt.step(); zero_grad (set to none)
// Output lines match bench_gpt_e2e's, including the machine-readable "RESULT ..." line; libtorch's CPU
// allocator keeps no peak counter, so alloc_mib is reported as 0.
//
// Attention uses at::_scaled_dot_product_attention(..., is_causal=true), which libtorch 1.13 has; on the
// CPU it runs the math path (explicit scores, masked softmax, second matmul) with autograd through it.
//
// Run: ./gpt_step_torch [--model small|gpt2-124M|tiny] [--seq-len T] [--batch B] [--steps N] [--warmup W]
//                       [--threads P]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <random>
#include <sys/resource.h>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct Config {
  int64_t vocab_size, block_size, n_layer, n_head, n_embd;
};

Config preset(const std::string& name) {
  if (name == "tiny") return {512, 64, 2, 2, 64};
  if (name == "small") return {8192, 256, 6, 6, 384};
  if (name == "gpt2-124M") return {50257, 1024, 12, 12, 768};
  throw std::runtime_error("gpt_step_torch: unknown model '" + name + "' (known: tiny, small, gpt2-124M)");
}

// GPT-2 init: weights N(0, 0.02), residual projections N(0, 0.02 / sqrt(2 L)), biases 0, LN weight 1.
torch::nn::Linear make_linear(int64_t in, int64_t out, double std) {
  torch::nn::Linear l(torch::nn::LinearOptions(in, out).bias(true));
  torch::NoGradGuard ng;
  l->weight.normal_(0.0, std);
  l->bias.zero_();
  return l;
}

struct BlockImpl : torch::nn::Module {
  BlockImpl(const Config& c) : n_head(c.n_head) {
    const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer));
    ln_1 = register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd}).eps(1e-5)));
    c_attn = register_module("c_attn", make_linear(c.n_embd, 3 * c.n_embd, 0.02));
    attn_proj = register_module("attn_proj", make_linear(c.n_embd, c.n_embd, proj_std));
    ln_2 = register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd}).eps(1e-5)));
    c_fc = register_module("c_fc", make_linear(c.n_embd, 4 * c.n_embd, 0.02));
    mlp_proj = register_module("mlp_proj", make_linear(4 * c.n_embd, c.n_embd, proj_std));
  }

  torch::Tensor attn(const torch::Tensor& x) {
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2), H = n_head, D = C / H;
    auto qkv = c_attn->forward(x).split(C, -1);                                      // 3 x (B,T,C)
    auto heads = [&](const torch::Tensor& t) { return t.view({B, T, H, D}).transpose(1, 2); };  // (B,H,T,D)
    auto y = std::get<0>(at::_scaled_dot_product_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), {}, 0.0,
                                                            false, /*is_causal=*/true));
    y = y.transpose(1, 2).contiguous().view({B, T, C});
    return attn_proj->forward(y);
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto h = x + attn(ln_1->forward(x));
    auto m = mlp_proj->forward(torch::gelu(c_fc->forward(ln_2->forward(h)), "tanh"));
    return h + m;
  }

  int64_t n_head;
  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  torch::nn::Linear c_attn{nullptr}, attn_proj{nullptr}, c_fc{nullptr}, mlp_proj{nullptr};
};
TORCH_MODULE(Block);

struct GPTImpl : torch::nn::Module {
  explicit GPTImpl(const Config& c) : cfg(c) {
    wte = register_module("wte", torch::nn::Embedding(c.vocab_size, c.n_embd));
    wpe = register_module("wpe", torch::nn::Embedding(c.block_size, c.n_embd));
    {
      torch::NoGradGuard ng;
      wte->weight.normal_(0.0, 0.02);
      wpe->weight.normal_(0.0, 0.02);
    }
    for (int64_t i = 0; i < c.n_layer; ++i) h.push_back(register_module("h" + std::to_string(i), Block(c)));
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd}).eps(1e-5)));
  }

  torch::Tensor loss(const torch::Tensor& idx, const torch::Tensor& targets) {
    const int64_t T = idx.size(1);
    auto pos = torch::arange(T, torch::kLong);
    auto x = wte->forward(idx) + wpe->forward(pos);  // (B,T,C)
    for (auto& b : h) x = b->forward(x);
    auto logits = torch::matmul(ln_f->forward(x), wte->weight.t());  // (B,T,V), tied head
    return torch::nn::functional::cross_entropy(logits.view({-1, cfg.vocab_size}), targets.view({-1}));
  }

  Config cfg;
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  std::vector<Block> h;
  torch::nn::LayerNorm ln_f{nullptr};
};
TORCH_MODULE(GPT);

// CPU seconds (user + system, all threads) this process has used: next to wall time, it shows how much
// of a step was lost to other processes on a busy machine.
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

int64_t peak_rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6));
  return 0;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

torch::Tensor random_tokens(int64_t B, int64_t T, int64_t V, std::mt19937_64& gen) {
  std::vector<int64_t> buf(static_cast<size_t>(B * T));
  std::uniform_int_distribution<int64_t> dist(0, V - 1);
  for (auto& t : buf) t = dist(gen);
  return torch::from_blob(buf.data(), {B, T}, torch::kLong).clone();
}

}  // namespace

int main(int argc, char** argv) try {
  std::string model = "small";
  int64_t T = 256, B = 8;
  int steps = 10, warmup = 3, threads = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) throw std::runtime_error("gpt_step_torch: option " + k + " needs a value");
    const std::string v = argv[++i];
    if (k == "--model") model = v;
    else if (k == "--seq-len") T = std::stoll(v);
    else if (k == "--batch") B = std::stoll(v);
    else if (k == "--steps") steps = std::stoi(v);
    else if (k == "--warmup") warmup = std::stoi(v);
    else if (k == "--threads") threads = std::stoi(v);
    else throw std::runtime_error("gpt_step_torch: unknown option " + k);
  }
  if (steps < 1) throw std::runtime_error("gpt_step_torch: --steps must be >= 1");
  if (threads > 0) torch::set_num_threads(threads);
  const Config cfg = preset(model);
  if (T > cfg.block_size) throw std::runtime_error("gpt_step_torch: seq-len exceeds block_size");
  torch::manual_seed(1337);
  GPT gpt(cfg);

  // The two decay groups of optim::decay_groups: rank >= 2 decays, rank 0/1 (biases, LN gains) does not.
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& p : gpt->parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                                 torch::optim::AdamWOptions(3e-4).weight_decay(0.1)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(
                                    torch::optim::AdamWOptions(3e-4).weight_decay(0.0)));
  torch::optim::AdamW opt(groups, torch::optim::AdamWOptions(3e-4));

  std::mt19937_64 gen(42);
  const auto idx = random_tokens(B, T, cfg.vocab_size, gen);
  const auto targets = random_tokens(B, T, cfg.vocab_size, gen);
  int64_t nparams = 0;
  for (auto& p : gpt->parameters()) nparams += p.numel();
  std::printf("libtorch %s GPT %s (params %.2fM) B=%lld T=%lld threads=%d\n", TORCH_VERSION, model.c_str(),
              static_cast<double>(nparams) * 1e-6, static_cast<long long>(B), static_cast<long long>(T),
              torch::get_num_threads());
  std::vector<double> ms, cpu_ms;
  for (int s = 0; s < warmup + steps; ++s) {
    const double c0 = cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    auto loss = gpt->loss(idx, targets);
    loss.backward();
    opt.step();
    for (auto& p : gpt->parameters()) p.mutable_grad() = torch::Tensor();  // set_to_none, as memtrain's zero_grad
    const auto t1 = std::chrono::steady_clock::now();
    const double dc = 1e3 * (cpu_seconds() - c0);
    const double dt = std::chrono::duration<double, std::milli>(t1 - t0).count();
    std::printf("  step %2d%s %9.1f ms  (cpu %9.1f ms)  loss %.4f\n", s, s < warmup ? " (warm-up)" : "          ", dt,
                dc, loss.item<double>());
    std::fflush(stdout);
    if (s >= warmup) ms.push_back(dt), cpu_ms.push_back(dc);
  }
  const double median = median_of(ms), cpu_median = median_of(cpu_ms);
  const double tok_s = static_cast<double>(B * T) / (median * 1e-3);
  const double rss_mib = static_cast<double>(peak_rss_kib()) / 1024.0;
  std::printf("median step %.1f ms (cpu %.1f ms), %.0f tokens/s, peak RSS %.0f MiB\n", median, cpu_median, tok_s,
              rss_mib);
  std::printf("RESULT impl=libtorch model=%s B=%lld T=%lld threads=%d step_ms=%.1f cpu_ms=%.1f tok_s=%.0f "
              "rss_mib=%.0f alloc_mib=0\n",
              model.c_str(), static_cast<long long>(B), static_cast<long long>(T), torch::get_num_threads(), median,
              cpu_median, tok_s, rss_mib);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
