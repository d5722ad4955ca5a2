import csv,sys,json,os
d=sys.argv[1]; step=float(sys.argv[2]) if len(sys.argv)>2 else 10
rows=list(csv.reader(open(os.path.join(d,'wan_links.csv'))))
hdr=rows[0]; data=[[float(x) for x in r] for r in rows[1:]]
# cumulative bytes? check monotonic
cum = all(data[i][1]>=data[i-1][1] for i in range(1,len(data)))
print("cumulative" if cum else "per-interval", "rows",len(data))
if not cum:
    acc=[0]*len(hdr); c=[]
    for r in data:
        acc=[r[0]]+[a+b for a,b in zip(acc[1:],r[1:])]; c.append(acc)
    data=c
t=0
print("t      "+" ".join(f"{h:>6}" for h in hdr[1:]))
def at(tt):
    for r in data:
        if r[0]>=tt: return r
    return data[-1]
while t < data[-1][0]:
    a=at(t); b=at(t+step); dt=b[0]-a[0]
    if dt<=0: break
    print(f"{t:5.0f}-{b[0]:5.0f} "+" ".join(f"{(y-x)/dt/1e6:6.2f}" for x,y in zip(a[1:],b[1:])))
    t+=step
a=data[0]; b=data[-1]
print("total MB "+" ".join(f"{(y-x)/1e6:6.0f}" for x,y in zip(a[1:],b[1:])))
