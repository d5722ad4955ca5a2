import sys,collections
cl=[0]*4+[1]*4+[2]*4+[3]*4
cut={2,3}
why={}
for line in open(sys.argv[2]):
    f=line.split()
    if f[0]!='DBGP': continue
    why.setdefault((int(f[2]),int(f[3]),int(f[4])),[]).append(f[1])
ev=collections.defaultdict(list)
for line in open(sys.argv[1]):
    t,i,a,b=line.split(); t=float(t); i=int(i); a=int(a); b=int(b)
    tag=i>>40; i&=(1<<40)-1
    ev[i].append((t,tag,a,b))
cnt=collections.Counter()
for i,e in sorted(ev.items()):
    e.sort()
    ins=[(t,a,b) for t,tag,a,b in e if tag==0 and cl[b] in cut and cl[a] not in cut]
    if len(ins)<2: continue
    for (t2,a2,b2) in ins[1:]:
        w=why.get((b2,a2,i),['plain'])
        ph='end' if t2>78 else ('start' if t2<10 else 'mid')
        cnt[(ph,'/'.join(w))]+=1
for k,v in sorted(cnt.items()): print(k,v)
