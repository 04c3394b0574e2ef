/*!
 * \file bench/depthwise_in_chain.cc
 * \brief MobileNetV2's expand-1x1 -> depthwise-3x3 -> project-1x1, as bare oneDNN primitives chained in C++
 *        (no byoc-hetero), timing each step in the chain and the depthwise step alone, hot in cache.
 *
 * Why: it was written when the per-kernel table of bench/run.py compared each conv inside our
 * module only with the bare primitive timed alone, where MobileNetV2's depthwise convs (then on
 * nhwc) reached 40-85%. It shows the same ratio without our module (the depthwise step reads what
 * the 1x1 conv just wrote, split differently across the cores), and that running the depthwise
 * step on one thread does not help. The table's *chained* column now measures this for every
 * layer; this program remains for the one-thread depthwise experiment.
 *
 *   P=$(python3 -c "import sys; print(sys.prefix)")   # onednn-devel-cpu-gomp installs the headers there
 *   g++ -O2 -fopenmp -std=c++17 bench/depthwise_in_chain.cc -I$P/include -L$P/lib -ldnnl \
 *       -Wl,-rpath,$P/lib -o /tmp/depthwise_in_chain && OMP_NUM_THREADS=2 /tmp/depthwise_in_chain
 */
#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>
using namespace dnnl;
int main(){
  engine eng(engine::kind::cpu,0); stream s(eng);
  auto any=[](memory::dims d){return memory::desc(d, memory::data_type::f32, memory::format_tag::any);};
  int cfg[][3]={{64,384,14},{96,576,14},{160,960,7},{32,192,28}};
  for(auto&c:cfg){ int ic=c[0], oc=c[1], hw=c[2];
   for (int dwthreads : {2, 1}) {
    post_ops po1; po1.append_eltwise(algorithm::eltwise_clip,0.f,6.f); primitive_attr a1; a1.set_post_ops(po1);
    omp_set_num_threads(2);
    convolution_forward::primitive_desc p1(eng, prop_kind::forward_inference, algorithm::convolution_direct, any({1,ic,hw,hw}), any({oc,ic,1,1}), any({oc}), any({1,oc,hw,hw}), {1,1},{0,0},{0,0}, a1);
    omp_set_num_threads(dwthreads);
    convolution_forward::primitive_desc p2(eng, prop_kind::forward_inference, algorithm::convolution_direct, p1.dst_desc(), any({oc,1,1,3,3}), any({oc}), p1.dst_desc(), {1,1},{1,1},{1,1}, a1);
    omp_set_num_threads(2);
    convolution_forward::primitive_desc p3(eng, prop_kind::forward_inference, algorithm::convolution_direct, p2.dst_desc(), any({ic,oc,1,1}), any({ic}), any({1,ic,hw,hw}), {1,1},{0,0},{0,0});
    auto fill=[&](memory m){ float* p=(float*)m.get_data_handle(); size_t n=m.get_desc().get_size()/4; for(size_t i=0;i<n;i++) p[i]=0.01f*(i%97); return m;};
    memory s1=fill(memory(p1.src_desc(),eng)), w1=fill(memory(p1.weights_desc(),eng)), b1=fill(memory(p1.bias_desc(),eng)), d1=fill(memory(p1.dst_desc(),eng));
    memory w2=fill(memory(p2.weights_desc(),eng)), b2=fill(memory(p2.bias_desc(),eng)), d2=fill(memory(p2.dst_desc(),eng));
    memory w3=fill(memory(p3.weights_desc(),eng)), b3=fill(memory(p3.bias_desc(),eng)), d3=fill(memory(p3.dst_desc(),eng));
    omp_set_num_threads(2); convolution_forward c1(p1), c3(p3); omp_set_num_threads(dwthreads); convolution_forward c2(p2); omp_set_num_threads(2);
    double t[3]={0,0,0}; int n=2000;
    for(int it=0; it<n+50; ++it){
      auto a=std::chrono::steady_clock::now();
      c1.execute(s,{{DNNL_ARG_SRC,s1},{DNNL_ARG_WEIGHTS,w1},{DNNL_ARG_BIAS,b1},{DNNL_ARG_DST,d1}});
      auto b=std::chrono::steady_clock::now();
      omp_set_num_threads(dwthreads);
      c2.execute(s,{{DNNL_ARG_SRC,d1},{DNNL_ARG_WEIGHTS,w2},{DNNL_ARG_BIAS,b2},{DNNL_ARG_DST,d2}});
      omp_set_num_threads(2);
      auto cc=std::chrono::steady_clock::now();
      c3.execute(s,{{DNNL_ARG_SRC,d2},{DNNL_ARG_WEIGHTS,w3},{DNNL_ARG_BIAS,b3},{DNNL_ARG_DST,d3}});
      auto d=std::chrono::steady_clock::now();
      if (it>=50){ t[0]+=std::chrono::duration<double,std::micro>(b-a).count(); t[1]+=std::chrono::duration<double,std::micro>(cc-b).count(); t[2]+=std::chrono::duration<double,std::micro>(d-cc).count(); }
    }
    // hot bare dw
    omp_set_num_threads(dwthreads);
    auto a=std::chrono::steady_clock::now(); for(int i=0;i<n;i++) c2.execute(s,{{DNNL_ARG_SRC,d1},{DNNL_ARG_WEIGHTS,w2},{DNNL_ARG_BIAS,b2},{DNNL_ARG_DST,d2}});
    double hot=std::chrono::duration<double,std::micro>(std::chrono::steady_clock::now()-a).count()/n; omp_set_num_threads(2);
    printf("%d->%d %dx%d dw threads %d: expand %.1f dw %.1f (hot alone %.1f) project %.1f total %.1f us\n", ic,oc,hw,hw,dwthreads,t[0]/n,t[1]/n,hot,t[2]/n,(t[0]+t[1]+t[2])/n);
   }
  }
}
