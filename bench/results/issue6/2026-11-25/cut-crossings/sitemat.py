import json,sys
# bytes (MB) received by each site from each other site, from a run's source.json
r=json.load(open(sys.argv[1]))
m={}
for n in r['receivers']:
    for f in n['received_from']:
        s=f['peer'].split('-')[0]
        if s==n['site']: continue
        m[(s,n['site'])]=m.get((s,n['site']),0)+f['bytes']/1e6
for k in sorted(m): print(f"{k[0]}->{k[1]} {m[k]:7.1f}")
