import sys,collections
# wan log: t piece from to ; nodes per cluster given by argv[2] (e.g. 4,4,4,4)
sizes=[int(x) for x in (sys.argv[2] if len(sys.argv)>2 else "4,4,4,4").split(',')]
cl=[]
for c,s in enumerate(sizes): cl+= [c]*s
cut=set(int(x) for x in (sys.argv[3] if len(sys.argv)>3 else "2,3").split(','))
ev=collections.defaultdict(list)
for line in open(sys.argv[1]):
    t,i,a,b=line.split(); t=float(t); i=int(i); a=int(a); b=int(b)
    ev[i].append((t,a,b))
n=len(ev); tot=0; dbl=[]
for i,e in ev.items():
    e.sort()
    ins=[(t,a,b) for t,a,b in e if cl[b] in cut and cl[a] not in cut]
    tot+=len(ins)
    if len(ins)>1: dbl.append((i,ins,e))
print("pieces",n,"crossings into cut",tot,"ratio %.3f"%(tot/n),"double",len(dbl))
# classify second crossings: by source cluster of 1st/2nd, time
C=collections.Counter(); T=collections.Counter()
for i,ins,e in dbl:
    (t1,a1,b1),(t2,a2,b2)=ins[0],ins[1]
    key=f"{'ABCD'[cl[a1]]}->{'ABCD'[cl[b1]]} then {'ABCD'[cl[a2]]}->{'ABCD'[cl[b2]]}"
    C[key]+=1; T[int(t2//10)*10]+=1
for k,v in C.most_common(): print(" ",k,v)
print(" second crossing by 10 s:",sorted(T.items()))
# for a few, the gap between crossings
gaps=sorted(ins[1][0]-ins[0][0] for i,ins,e in dbl)
if gaps: print(" gap between crossings s: min %.2f med %.2f max %.2f"%(gaps[0],gaps[len(gaps)//2],gaps[-1]))
import os
if os.environ.get('SHOW'):
    for i,ins,e in sorted(dbl,key=lambda x:x[1][1][0]):
        print(i, i%4, ' | '.join(f"{t:.2f} {a}->{b}" for t,a,b in e))
